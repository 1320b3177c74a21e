"""The warehouse's files: small files, handed-over metadata, object-store bounds."""

"""The group protocol: names, records, the assignors, the group client."""

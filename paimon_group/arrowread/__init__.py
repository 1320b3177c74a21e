"""An Arrow-native reader of a shard's splits, equal to pypaimon's reader.

* :mod:`.files`: decoding data files (Parquet, ORC, Avro), deletion vectors;
* :mod:`.classify`: which tables and splits are read here, and how;
* :mod:`.merge`: merge-on-read of primary-key rows with pyarrow compute;
* :mod:`.reader`: a split's pieces and their output batches;
* :mod:`.path`: the planner's read path, with pypaimon's reader as fallback;
* :mod:`.levels`: the engine's lookup merge (the merged reads of a pypaimon
  ``TableRead`` given to :func:`~.levels.follow_lookup_levels` follow it;
  importing this package changes nothing in pypaimon).
"""

from paimon_group.arrowread.files import Unsupported
from paimon_group.arrowread.path import ReadPath
from paimon_group.arrowread.reader import ArrowSplitReader

__all__ = ["ArrowSplitReader", "ReadPath", "Unsupported"]

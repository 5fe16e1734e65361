"""The event vocabulary: the one behaviour-event schema, the features derived from events, the partition
rule and the long-tail definition — the ground every room shares.

The lowest layer above storage: it imports nothing else of dinrec but storage, so ingestion, streams,
datasets and training-data building share one definition of an event and of a behaviour history.
"""

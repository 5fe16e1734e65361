"""Behaviour events, the features derived from them, online stores and event streams.

The leftmost layer: it imports nothing else of dinrec, so ingestion (here) and training-data
building (``training``) share one definition of an event and of a behaviour history.
"""

"""The online store (a user's recent behaviours, item popularity, A/B counters) and ingestion, which reads the
event stream into it exactly once in effect.
"""

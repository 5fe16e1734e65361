"""Scheduled retraining behind a promotion gate (`dinrec retrain`): see job.py."""

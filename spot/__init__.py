"""Spot GPU training jobs: choose the instance (catalog, planner), launch it (EC2 or SageMaker),
survive interruptions (IMDSv2 watcher, supervisor) and report what it cost."""

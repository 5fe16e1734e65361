"""Candidate recall: vectors in, item ids out (FAISS inner-product index, exact search)."""

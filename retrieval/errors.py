"""retrieval's own exceptions (FAISS errors are mapped to these at the adapter)."""


class RetrievalError(Exception):
    """Base class for retrieval errors."""


class IndexFormatError(RetrievalError, ValueError):
    """An index file is missing, unreadable, or does not match its id list."""

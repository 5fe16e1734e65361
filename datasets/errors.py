"""The dataset loaders' errors."""


class DatasetError(ValueError):
    """A dataset folder or file is not in a layout dinrec recognises, or is malformed."""

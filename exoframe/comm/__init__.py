from .communicator import Communicator, Handle
from .flat import flatten, flatten_bytes, unflatten_bytes_into, unflatten_into

__all__ = ["Communicator", "Handle", "flatten", "flatten_bytes", "unflatten_bytes_into",
           "unflatten_into"]

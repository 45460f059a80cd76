from .communicator import Communicator, Handle
from .flat import flatten, unflatten_into

__all__ = ["Communicator", "Handle", "flatten", "unflatten_into"]

"""Credit stores behind the reservation meter."""

from floorguard.store.base import CreditStore, Grant, StoreUnavailable
from floorguard.store.memory import MemoryCreditStore

__all__ = ["CreditStore", "Grant", "MemoryCreditStore", "StoreUnavailable"]

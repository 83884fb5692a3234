"""Durable state of one consensus member: hard state, transaction log, snapshots."""

from services.consensus.storage.data_dir import DataDir, load
from services.consensus.storage.hard_state import CorruptHardStateError, HardStateFile
from services.consensus.storage.snapshots import Snapshots
from services.consensus.storage.txn_log import CorruptLogError, LogFailedError, TxnLog

__all__ = [
    "CorruptHardStateError",
    "CorruptLogError",
    "DataDir",
    "HardStateFile",
    "LogFailedError",
    "Snapshots",
    "TxnLog",
    "load",
]

"""Reading what an offline W&B run wrote (tests/outputs/test_wandb.py,
tests/end_to_end/test_evaluation_runs.py): the records of its .wandb file and the
history rows among them."""

from __future__ import annotations

import json
import struct


def wandb_records(path: str) -> list:
    """The records of a .wandb file, as wandb's own protobuf `Record`s.

    The file is W&B's LevelDB-style log (wandb ships no Python reader since its core moved
    to Go): a 7-byte header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks,
    each a 4-byte CRC, a 2-byte length, a 1-byte type (1 full, 2 first, 3 middle, 4 last)
    and its data; a block's last bytes, when fewer than a chunk header, are padding.
    """
    from wandb.proto import wandb_internal_pb2

    block, header = 32768, 7
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    records, chunks, pos = [], [], header
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunks.append(data[pos + header : pos + header + length])
        pos += header + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records


def history_rows(records) -> list[dict]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows

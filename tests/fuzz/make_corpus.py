#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora into tests/fuzz/corpus/NAME (committed;
rerun after changing a harness's input format). Valid inputs of each kind,
so that mutations start deep: a safetensors file, a checkpoint manifest that
tiles the flat space, saved-chunk files of the right size, NVMe adoptions
with the true checksums, one request of every RPC of both services
naming job "fuzz" (services_fuzz.cc's layout: RPC index, flags, request),
and pushes as a shard server reads them."""

import json
import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

# services_fuzz.cc's Rpcs(), in order.
RPCS = ["RegisterServer", "CreateJob", "GetJob", "ListJobs", "DeleteJob", "JoinJob", "Heartbeat",
        "LeaveJob", "RenewGeneration", "ListMembers", "GetPlacement", "SaveCheckpoint",
        "ListCheckpoints", "KvSet", "KvGet", "WatchGeneration", "AllocateChunks", "DropJob",
        "WriteParams", "WriteState", "Push", "Pull", "ReadState", "ListChunks", "SaveChunks",
        "LoadChunks", "CommitStep", "DrainServer", "RebalanceJob", "SeedChunks",
        "ReadStepLog"]


def varint(value):
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, value):
    """One protobuf field: ints as varints, bytes/str/nested as length-delimited,
    floats as fixed32."""
    if isinstance(value, float):
        return varint(number << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def message(*fields):
    return b"".join(field(n, v) for n, v in fields)


def write(name, seed, data):
    directory = os.path.join(ROOT, name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, seed), "wb") as f:
        f.write(data)


def safetensors():
    values = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    header = json.dumps({"__metadata__": {"step": "3"},
                         "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    write("safetensors_fuzz", "two-tensors", struct.pack("<Q", len(header)) + header + values)
    write("safetensors_fuzz", "empty-header", struct.pack("<Q", 2) + b"{}")


def checkpoint_manifest():
    # checkpoint_manifest_fuzz.cc's state file: chunk-00000000.state of 64 params.
    manifest = {"spec": {"jobId": "j", "tensors": [{"name": "w", "shape": ["64"]}],
                         "worldSize": 1, "chunkNumParams": "64"},
                "flatNumParams": "64", "step": "1",
                "files": [{"chunk": {"chunkId": 0, "flatBegin": "0", "numParams": "64"},
                           "file": "chunk-00000000.state", "numBytes": "768",
                           "checksum": "12345"}]}
    write("checkpoint_manifest_fuzz", "one-chunk", json.dumps(manifest).encode())
    manifest["files"][0]["chunk"]["numParams"] = "18446744073709551615"
    write("checkpoint_manifest_fuzz", "huge-chunk", json.dumps(manifest).encode())


def saved_chunk():
    state = struct.pack("<12f", *range(12))  # 4 params: p, m, v
    write("saved_chunk_fuzz", "four-params", bytes([1]) + struct.pack("<H", 4) + state)
    write("saved_chunk_fuzz", "wrong-size", bytes([1]) + struct.pack("<H", 5) + state)


def nvme_extent():
    for blocks, choice in [(1, 0), (4, 0), (2, 1), (3, 3)]:
        write("nvme_extent_fuzz", "blocks-%d-checksums-%d" % (blocks, choice),
              bytes([blocks - 1]) + bytes(16) + bytes([choice]) + bytes(range(64)))


def services():
    job = "fuzz"
    spec = message((1, job), (2, message((1, "w"), (2, message((1, 1000))))),
                   (2, message((1, "b"), (2, message((1, 10))))), (3, 1), (4, 256), (6, 1))
    grads = bytes(4 * 64)
    requests = {
        "RegisterServer": message((1, message((1, "127.0.0.1:1"), (2, 1 << 20)))),
        "CreateJob": message((1, spec)),
        "JoinJob": message((1, job), (2, "w2")),
        "Heartbeat": message((1, job), (2, "w")),
        "KvSet": message((1, "job/fuzz/generation-1/x"), (2, "v")),
        "KvGet": message((1, "job/fuzz/generation-1/0")),
        "SaveCheckpoint": message((1, job), (2, "/tmp")),
        "AllocateChunks": message((1, spec), (2, message((1, 9), (2, 1 << 20), (3, 64)))),
        "WriteParams": message((1, job), (2, 0), (3, struct.pack("<4f", 1, 2, 3, 4))),
        "Push": message((1, job), (2, 2), (3, 0), (4, 64), (5, 1), (6, 1.0), (7, grads)),
        "Pull": message((1, job), (2, 1), (3, 0), (4, 64)),
        "CommitStep": message((1, job), (2, 1), (3, 1), (4, 0), (5, 1.0)),
        "DrainServer": message((1, "127.0.0.1:1")),
        "RebalanceJob": message((1, job)),
        "ReadState": message((1, job), (2, 0), (3, 64)),
        "SaveChunks": message((1, job), (2, 1), (3, "../../etc")),
        "LoadChunks": message((1, job), (2, "/etc")),
        "SeedChunks": message((1, job), (2, "127.0.0.1:1"), (3, message((1, 0), (2, 0), (3, 256)))),
        "ReadStepLog": message((1, job), (2, 0), (3, 64), (6, 1)),
    }
    for index, rpc in enumerate(RPCS):
        # Flags bit 0: the harness names job "fuzz" where the request does not.
        write("services_fuzz", "%02d-%s-empty" % (index, rpc), bytes([index, 1]))
        if rpc in requests:
            write("services_fuzz", "%02d-%s" % (index, rpc), bytes([index, 0]) + requests[rpc])


def push_message():
    """Pushes as a shard server reads them (push_message_fuzz.cc's layout:
    slice bytes - 1, then the PushRequest): with group learning rates and a
    loss scaler, cut into slices of 7 and of 256 bytes."""
    grads = bytes(range(256)) * 2
    push = message((1, "fuzz"), (2, 3), (3, 4096), (4, 256), (5, 2), (6, 0.5), (7, grads),
                   (8, 2), (9, 1e-3), (10, message((1, 1024.0), (2, 7))), (11, 1), (12, 1),
                   (13, struct.pack("<2f", 1e-3, 2e-3)))
    write("push_message_fuzz", "slices-of-7", bytes([6]) + push)
    write("push_message_fuzz", "slices-of-256", bytes([255]) + push)


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    safetensors()
    checkpoint_manifest()
    saved_chunk()
    nvme_extent()
    services()
    push_message()


if __name__ == "__main__":
    main()

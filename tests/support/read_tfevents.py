#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, for cross-checking the engine's writer.

Usage: read_tfevents.py EVENTS_FILE OUT_JSON

Decodes the TFRecord framing (verifying both masked CRC-32C values with a bitwise CRC written
here) and the tensorflow.Event protocol buffers with manual varints, then writes
{"file_version": ..., "scalars": [{"tag", "value", "step", "wall_time"}, ...]} to OUT_JSON.
Uses only the standard library (Debian's python3 has neither tensorboard nor tensorflow).
Exits 1 with a message on any framing or CRC error.
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, pos):
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def fields(buf):
    """Yields (field number, wire type, value) of a message; value is int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def main():
    path, out = sys.argv[1], sys.argv[2]
    data = open(path, "rb").read()
    pos, scalars, file_version = 0, [], None
    while pos < len(data):
        header = data[pos:pos + 12]
        if len(header) < 12:
            sys.exit(f"truncated header at {pos}")
        (length,) = struct.unpack("<Q", header[:8])
        if struct.unpack("<I", header[8:])[0] != masked(crc32c(header[:8])):
            sys.exit(f"length CRC mismatch at {pos}")
        payload = data[pos + 12:pos + 12 + length]
        footer = data[pos + 12 + length:pos + 16 + length]
        if len(payload) < length or len(footer) < 4:
            sys.exit(f"truncated record at {pos}")
        if struct.unpack("<I", footer)[0] != masked(crc32c(payload)):
            sys.exit(f"payload CRC mismatch at {pos}")
        pos += 16 + length

        wall_time, step, summaries = 0.0, 0, []
        for number, wire, value in fields(payload):
            if number == 1 and wire == 1:
                (wall_time,) = struct.unpack("<d", value)
            elif number == 2 and wire == 0:
                step = value - (1 << 64) if value >= 1 << 63 else value
            elif number == 3 and wire == 2:
                file_version = value.decode()
            elif number == 5 and wire == 2:
                summaries.append(value)
        for summary in summaries:
            for number, wire, value in fields(summary):
                if number != 1 or wire != 2:
                    continue
                tag, simple = None, None
                for vnum, vwire, v in fields(value):
                    if vnum == 1 and vwire == 2:
                        tag = v.decode()
                    elif vnum == 2 and vwire == 5:
                        (simple,) = struct.unpack("<f", v)
                if simple is not None:
                    scalars.append({"tag": tag, "value": simple, "step": step, "wall_time": wall_time})
    with open(out, "w") as f:
        json.dump({"file_version": file_version, "scalars": scalars}, f)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Hugging Face model folders for the HF-style test models (hf_llama.py, hf_gpt2.py), written
from transformers' documented behaviour because Debian has no `transformers`:

  write_folder   what save_pretrained writes: config.json (json.dumps with indent 2 and sorted
                 keys), the weights in model.safetensors or, past max_shard_size, in
                 model-0000N-of-0000M.safetensors with model.safetensors.index.json
                 ({"metadata": {"total_size"}, "weight_map"}), each file's metadata {"format": "pt"}.
                 The split is huggingface_hub's: tensors in state_dict order; one that would take the
                 shard past the limit starts a new shard; one larger than the limit gets its own.
  read_folder    what from_pretrained reads: config.json, then model.safetensors or else the index
                 and every shard it lists; a listed shard missing or a tensor in two shards fails.
  check_layout   a folder's files and index equal what write_folder makes of the same state.
"""
import json
import os
import shutil

import safetensors_torch

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"


def nbytes(t):
    return t.numel() * t.element_size()


def split(state, max_bytes):
    shards, current, size = [], {}, 0
    for name, t in state.items():
        if nbytes(t) > max_bytes:
            shards.append({name: t})
            continue
        if size + nbytes(t) > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += nbytes(t)
    if current:
        shards.append(current)
    return shards


def planned_files(state, max_bytes):
    """{file: shard} and the index (None for one file) that save_pretrained writes."""
    shards = split(state, max_bytes)
    if len(shards) <= 1:
        return {WEIGHTS: state}, None
    files = {f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors": s for i, s in enumerate(shards)}
    index = {"metadata": {"total_size": sum(nbytes(t) for t in state.values())},
             "weight_map": {name: f for f, s in files.items() for name in s}}
    return files, index


def write_folder(out_dir, config, state, max_bytes):
    shutil.rmtree(out_dir, ignore_errors=True)  # no stale shards of an earlier save
    os.makedirs(out_dir)
    with open(os.path.join(out_dir, CONFIG), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    files, index = planned_files(state, max_bytes)
    for name, shard in files.items():
        safetensors_torch.write(os.path.join(out_dir, name), shard, {"format": "pt"})
    if index is not None:
        with open(os.path.join(out_dir, INDEX), "w") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def read_weights(folder):
    index_path = os.path.join(folder, INDEX)
    if os.path.exists(os.path.join(folder, WEIGHTS)):  # from_pretrained looks for it first
        tensors, metadata = safetensors_torch.read(os.path.join(folder, WEIGHTS))
        check_format(WEIGHTS, metadata)
        return tensors
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    state = {}
    for name in sorted(set(weight_map.values())):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            raise SystemExit(f"{index_path}: shard {name} is missing")
        tensors, metadata = safetensors_torch.read(path)
        check_format(name, metadata)
        for key, t in tensors.items():
            if key in state:
                raise SystemExit(f"{index_path}: {key} is in two shards")
            if weight_map.get(key) != name:
                raise SystemExit(f"{index_path}: {key} is in {name}, the index says {weight_map.get(key)}")
            state[key] = t
    if set(state) != set(weight_map):
        raise SystemExit(f"{index_path}: listed but absent: {sorted(set(weight_map) - set(state))}")
    return state


def check_format(name, metadata):
    if metadata.get("format") != "pt":  # transformers refuses such files
        raise SystemExit(f"{name}: metadata format is {metadata.get('format')!r}, transformers needs 'pt'")


def read_folder(folder):
    with open(os.path.join(folder, CONFIG)) as f:
        config = json.load(f)
    return config, read_weights(folder)


def check_layout(folder, state, max_bytes):
    """The folder's weight files and index are those save_pretrained writes for `state`."""
    files, index = planned_files(state, max_bytes)
    present = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if present != sorted(files):
        raise SystemExit(f"{folder}: weight files {present}, save_pretrained writes {sorted(files)}")
    for name, shard in files.items():
        keys = list(safetensors_torch.read(os.path.join(folder, name), verify=False)[0])
        if sorted(keys) != sorted(shard):
            raise SystemExit(f"{folder}/{name}: holds {sorted(keys)}, save_pretrained puts {sorted(shard)} there")
    if index is not None:
        with open(os.path.join(folder, INDEX)) as f:
            found = json.load(f)
        if found != index:
            raise SystemExit(f"{folder}/{INDEX}: {found}, save_pretrained writes {index}")

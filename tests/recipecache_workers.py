"""Worker processes for the multi-process recipecache tests: python recipecache_workers.py ROLE ARGS..."""

import hashlib
import json
import logging
import random
import sys
from pathlib import Path

from recipecache import CacheConfig, RecipeCache

MIN_SIZE, MAX_SIZE = 1024, 200 * 1024


def key_for(writer: int, index: int) -> str:
    """Keys spread over shards like real hashes, yet say who wrote them."""
    return hashlib.sha256(f"{writer}/{index}".encode()).hexdigest()[:12] + f"-w{writer}-{index}"


def payload_for(key: str) -> bytes:
    """The payload is a function of the key, so anyone can check what a reader got."""
    rng = random.Random(key)
    return rng.randbytes(rng.randint(MIN_SIZE, MAX_SIZE))


class _ErrorCounter(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record):
        self.count += 1
        sys.stderr.write(self.format(record) + "\n")


def _open(args: dict, **overrides) -> RecipeCache:
    cfg = dict(path=args["path"], max_size_mb=args["limit_mb"], fsync=args.get("fsync", True),
               delete_on_start=args.get("delete_on_start", False))
    cfg.update(overrides)
    return RecipeCache(CacheConfig(**cfg))


def writer(args: dict) -> int:
    cache = _open(args)
    progress = Path(args["progress"]) if args.get("progress") else None
    for i in range(args["count"]):
        key = key_for(args["writer"], i)
        cache.put(key, payload_for(key), {"writer": args["writer"], "compile_time_s": 0.5}, wait=args["wait"])
        if progress is not None:
            with open(progress, "a") as f:
                f.write(f"{i}\n")
    cache.flush()
    return 0


def reader(args: dict) -> int:
    cache = _open(args, memory_entries=0)
    rng, hits = random.Random(args["seed"]), 0
    for _ in range(args["reads"]):
        key = key_for(rng.randrange(args["writers"]), rng.randrange(args["count"]))
        data = cache.get(key)
        if data is not None:
            if data != payload_for(key):
                raise AssertionError(f"reader got wrong bytes for {key}")
            hits += 1
    cache.flush()
    print(json.dumps({"hits": hits}))
    return 0


def starter(args: dict) -> int:
    """Open with delete_on_start, then write; every key written after the open must survive peers' opens."""
    cache = _open(args)
    for i in range(args["count"]):
        key = key_for(args["writer"], i)
        cache.put(key, payload_for(key)[:2048], wait=True)
    return 0


if __name__ == "__main__":
    errors = _ErrorCounter()
    logging.getLogger("recipecache").addHandler(errors)
    role, payload = sys.argv[1], json.loads(sys.argv[2])
    code = {"writer": writer, "reader": reader, "starter": starter}[role](payload)
    sys.exit(code or (3 if errors.count else 0))

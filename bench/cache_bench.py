"""Recipe cache latency benchmark: recipecache against a naive scan-on-every-put baseline (JAX lru_cache style).

Measures, at each cache size (entries of --entry-kb KB):
  get p50/p99 from the disk tier (memory tier off) and from the memory tier,
  put p50/p99 as the caller sees it (background write) and the background write throughput up to flush(),
  the time of a store that triggers a trim, and of a bulk eviction to half the size,
and the same get/put/eviction numbers for the naive baseline. Writes JSON and prints a table.

    python bench/cache_bench.py            # 1k and 10k entries
    python bench/cache_bench.py --quick    # CI smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from filelock import FileLock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recipecache import CacheConfig, RecipeCache, encode_entry  # noqa: E402
from recipecache.disk import DiskStore  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "cache_bench.json"


class NaiveCache:
    """The baseline: one file per key, a lock around every operation, a directory scan on every put."""

    def __init__(self, path: Path, limit_bytes: int):
        self.path = path
        self.limit = limit_bytes
        path.mkdir(parents=True, exist_ok=True)
        self.lock = FileLock(str(path / ".lock"))

    def get(self, key: str) -> bytes | None:
        with self.lock:
            file = self.path / key
            if not file.exists():
                return None
            data = file.read_bytes()
            os.utime(file)  # recency by atime/mtime on every hit
            return data

    def put(self, key: str, payload: bytes) -> None:
        with self.lock:
            file = self.path / key
            if file.exists():
                return
            file.write_bytes(payload)
            self._evict()

    def _evict(self) -> None:
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.path.iterdir() if p.name != ".lock"]
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.limit:
                break
            path.unlink()
            total -= size


def percentiles(samples_ns: list[int]) -> dict:
    ms = sorted(s / 1e6 for s in samples_ns)
    return {"p50_ms": round(statistics.median(ms), 4), "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 4),
            "n": len(ms)}


def timed(fn, args_list) -> list[int]:
    samples = []
    for args in args_list:
        start = time.perf_counter_ns()
        fn(*args)
        samples.append(time.perf_counter_ns() - start)
    return samples


def prefill(path: Path, n: int, payload: bytes, created: float) -> None:
    """Write n entries straight to the layout (fast, unmeasured), then let the cache count them."""
    disk = DiskStore(path, fsync=False)
    disk.open(allow_shared=False)
    for i in range(n):
        key = f"{i:08x}"
        shard = disk.entries_dir / key[:2]
        shard.mkdir(exist_ok=True, mode=0o700)
        disk.entry_path(key).write_bytes(encode_entry(key, payload, {"compile_time_s": 1.0}, created))


def bench_recipecache(root: Path, n: int, ops: int, payload: bytes, fsync: bool) -> dict:
    path = root / f"rc{n}"
    prefill(path, n, payload, time.time())
    big = CacheConfig(path=path, max_size_mb=-1, fsync=fsync, memory_entries=0)
    cache = RecipeCache(big)
    cache.flush()  # first open reconciles the ledger by one scan
    keys = [(f"{random.randrange(n):08x}",) for _ in range(ops)]
    result = {"get_disk": percentiles(timed(cache.get, keys))}
    mem = RecipeCache(CacheConfig(path=path, max_size_mb=-1, fsync=fsync, memory_entries=ops))
    hot = keys[: max(1, ops // 10)]
    timed(mem.get, hot)
    result["get_memory"] = percentiles(timed(mem.get, hot * 10))
    new = [(f"n{i:07x}", payload) for i in range(ops)]
    start = time.perf_counter()
    result["put_caller"] = percentiles(timed(cache.put, new))
    cache.flush()
    seconds = time.perf_counter() - start
    result["put_background"] = {"puts_per_s": round(ops / seconds, 1),
                                "mb_per_s": round(ops * len(payload) / seconds / 2**20, 1)}
    result.update(bench_eviction(path, payload, fsync))
    mem.flush()  # persist stats now: the directory is removed before interpreter exit
    return result


def bench_eviction(path: Path, payload: bytes, fsync: bool) -> dict:
    total = RecipeCache(CacheConfig(path=path, max_size_mb=-1)).total_bytes()
    cache = RecipeCache(CacheConfig(path=path, max_size_mb=total / 2**20, fsync=fsync, memory_entries=0))
    trim = timed(lambda k: cache.put(k, payload, wait=True), [("trigger0",)])[0]
    start = time.perf_counter_ns()
    evicted = cache.evict(max_bytes=total // 2)
    bulk = time.perf_counter_ns() - start
    cache.flush()
    return {"store_with_trim_ms": round(trim / 1e6, 2),
            "evict_half": {"ms": round(bulk / 1e6, 2), "entries": len(evicted)}}


def bench_naive(root: Path, n: int, ops: int, payload: bytes) -> dict:
    path = root / f"naive{n}"
    path.mkdir(parents=True)
    for i in range(n):
        (path / f"{i:08x}").write_bytes(payload)
    cache = NaiveCache(path, limit_bytes=2**62)
    keys = [(f"{random.randrange(n):08x}",) for _ in range(ops)]
    result = {"get_disk": percentiles(timed(cache.get, keys))}
    puts = max(20, ops // 5)  # every put scans the directory; fewer samples keep the run short
    result["put_caller"] = percentiles(timed(cache.put, [(f"n{i:07x}", payload) for i in range(puts)]))
    cache.limit = sum(p.stat().st_size for p in path.iterdir()) - 1
    result["store_with_trim_ms"] = round(timed(cache.put, [("trigger0", payload)])[0] / 1e6, 2)
    cache.limit = (n + puts) * len(payload) // 2
    start = time.perf_counter_ns()
    cache._evict()
    result["evict_half"] = {"ms": round((time.perf_counter_ns() - start) / 1e6, 2)}
    return result


def print_table(results: dict) -> None:
    head = f"{'impl':<12}{'entries':>8}{'get p50':>9}{'get p99':>9}{'put p50':>9}{'put p99':>9}" \
           f"{'bg put/s':>10}{'trim ms':>9}{'evict½ ms':>10}"
    print(head + "\n" + "-" * len(head))
    for impl in ("recipecache", "naive"):
        for n, r in results[impl].items():
            bg = r.get("put_background", {}).get("puts_per_s", "-")
            print(f"{impl:<12}{n:>8}{r['get_disk']['p50_ms']:>9.3f}{r['get_disk']['p99_ms']:>9.3f}"
                  f"{r['put_caller']['p50_ms']:>9.3f}{r['put_caller']['p99_ms']:>9.3f}{bg:>10}"
                  f"{r['store_with_trim_ms']:>9.1f}{r['evict_half']['ms']:>10.1f}")
    for n, r in results["recipecache"].items():
        print(f"recipecache {n}: memory-tier get p50 {r['get_memory']['p50_ms']:.4f} ms, "
              f"p99 {r['get_memory']['p99_ms']:.4f} ms")
    print("times in ms; put = caller-visible latency; bg put/s = background writes per second up to flush()")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run")
    parser.add_argument("--sizes", type=int, nargs="+", help="entry counts (default 1000 10000; quick 100 500)")
    parser.add_argument("--ops", type=int, help="measured operations per size (default 1000; quick 100)")
    parser.add_argument("--entry-kb", type=int, default=100, help="entry payload size in KB")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync before publishing")
    parser.add_argument("--dir", type=Path, help="where to build the caches (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.out is None:  # a quick (smoke) run never overwrites the full results
        full = RESULTS
        args.out = full.with_name(full.stem + "_quick.json") if args.quick else full
    sizes = args.sizes or ([100, 500] if args.quick else [1000, 10000])
    ops = args.ops or (100 if args.quick else 1000)
    payload = random.Random(0).randbytes(args.entry_kb * 1024)
    root = Path(tempfile.mkdtemp(prefix="cache_bench-", dir=args.dir))
    try:
        results = {"recipecache": {n: bench_recipecache(root, n, ops, payload, not args.no_fsync) for n in sizes},
                   "naive": {n: bench_naive(root, n, ops, payload) for n in sizes}}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {"config": {"sizes": sizes, "ops": ops, "entry_kb": args.entry_kb, "fsync": not args.no_fsync,
                         "quick": args.quick, "python": platform.python_version(), "cpus": os.cpu_count()},
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print_table(results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

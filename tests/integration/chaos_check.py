#!/usr/bin/env python3
"""Reads the chaos soak's logs (tests/integration/chaos-soak) and prints its
figures: transfers, bytes verified, faults by kind, failovers, queue pairs the
watch declared failed, and every violation of a promise. Exit status 1 when
anything was lost, corrupted, doubled, missing or late, a process opened
descriptors after warm-up, or its resident memory grew by 5 % and at least
4 MiB after warm-up. A new queue pair costs a process a few hundred KiB the
first time (the provider's queues, the allocator's arenas): growth below the
floor is that, not a leak. With GPUVERBS_SOAK_MEMORY=report (the thread
sanitizer's run, whose shadow memory grows by megabytes with every new mapping)
the memory is printed and not judged."""
import collections
import glob
import os
import sys


def main(out):
    faults = collections.Counter()
    for line in open(os.path.join(out, "faults.log")):
        parts = line.split()
        if len(parts) == 2:
            faults[parts[1]] += 1
    totals = collections.Counter()
    violations = []
    ok_notified = set()
    peers_seen = 0
    resources = collections.defaultdict(list)  # per process life: (fds, rss)
    for path in sorted(glob.glob(os.path.join(out, "peer*.log"))):
        life = 0
        for line in open(path):
            words = line.split()
            if not words:
                continue
            if words[0] == "ok" and len(words) >= 5:
                ok_notified.add(int(words[4]))
            elif words[0] == "violation":
                violations.append(f"{os.path.basename(path)}: {line.strip()}")
            elif words[0] == "peer-summary":
                peers_seen += 1
                for kv in words[1:]:
                    k, v = kv.split("=")
                    totals[k] += int(v)
            elif words[0] == "resources":
                resources[(path, life)].append((int(words[1]), int(words[2])))
            elif words[0] == "connected" and not resources.get((path, life)):
                pass
            if words[0] == "peer-summary":
                life += 1
    # Transfers of peers that were killed have no summary: count their lines.
    transfers_logged = collections.Counter()
    for path in sorted(glob.glob(os.path.join(out, "peer*.log"))):
        for line in open(path):
            w = line.split()
            if w and w[0] in ("ok", "failed"):
                transfers_logged[w[0]] += 1
    notified = collections.Counter()
    owner_summary = ""
    for line in open(os.path.join(out, "owner.log")):
        words = line.split()
        if words and words[0] == "notified":
            notified[(int(words[1]) << 24) | int(words[2])] += 1
        elif words and words[0] == "owner-summary":
            owner_summary = line.strip()
        elif words and words[0] == "resources":
            resources[("owner", 0)].append((int(words[1]), int(words[2])))
    doubled = [n for n, c in notified.items() if c > 1]
    missing = [n for n in ok_notified if notified[n] == 0]
    for n in doubled:
        violations.append(f"owner: notification {n:#x} received {notified[n]} times")
    for n in missing:
        violations.append(f"owner: notification {n:#x} of a transfer that succeeded never arrived")
    growth = []
    judge_memory = os.environ.get("GPUVERBS_SOAK_MEMORY", "judge") != "report"
    for key, samples in resources.items():
        if len(samples) < 6:
            continue
        warm = samples[len(samples) // 3]  # after warm-up: a third of the way in
        last = samples[-1]
        fd_growth = last[0] - warm[0]
        rss_growth = (last[1] - warm[1]) / warm[1] if warm[1] else 0.0
        growth.append((key[0], fd_growth, rss_growth))
        if fd_growth > 0:
            violations.append(f"{os.path.basename(key[0])}: open descriptors grew by {fd_growth} after warm-up")
        rss_kib = last[1] - warm[1]
        if judge_memory and rss_growth >= 0.05 and rss_kib >= 4096:
            violations.append(f"{os.path.basename(key[0])}: resident memory grew {rss_growth:.1%} after warm-up")
    print(f"chaos-soak: {transfers_logged['ok'] + transfers_logged['failed']} transfers "
          f"({transfers_logged['ok']} succeeded, {transfers_logged['failed']} failed by a fault), "
          f"{totals['bytes_verified']} bytes verified in {totals['blocks_verified']} landed blocks, "
          f"{totals['untouched_verified']} never-posted blocks verified untouched")
    print(f"chaos-soak: {sum(faults.values())} faults: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    print(f"chaos-soak: failovers {totals['failovers']}, queue pairs the watch declared failed "
          f"{totals['qps_declared_failed']}, operations it ended itself {totals['completed_by_library']}, "
          f"posts after an error refused at once {totals['reuse_refused']}, reconnects {totals['reconnects']}")
    print(f"chaos-soak: notifications {sum(notified.values())} received, {len(doubled)} doubled, "
          f"{len(missing)} missing; {owner_summary}")
    for name, fds, rss in growth:
        print(f"chaos-soak: {os.path.basename(name)}: descriptors {fds:+d}, resident memory {rss:+.1%} after warm-up"
              + ("" if judge_memory else " (not judged: GPUVERBS_SOAK_MEMORY=report)"))
    for v in violations:
        print(f"chaos-soak: VIOLATION {v}")
    print(f"chaos-soak: {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

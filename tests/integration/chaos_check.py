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
the memory is printed and not judged.

Each transfer is judged against the faults it met, not only its deadline: it
must end by the latest of its start plus GPUVERBS_SOAK_QUIET seconds (3) and,
for every fault that overlapped it, the fault's start (or the transfer's, if
later) plus that fault's own bound (docs/transfers.md, "Bounds": T = 50 ms,
G = 250 ms, S = 1.44 s) plus GPUVERBS_SOAK_SLACK seconds (1.5) for the rig's
emulated CPU. The run must also have had GPUVERBS_SOAK_MIN_FAULTS faults (5)
of GPUVERBS_SOAK_MIN_KINDS kinds (4): a soak that broke nothing proves nothing.
A notification of a transfer that succeeded is excused when the owner was
killed within a second of it (acknowledged by its NIC, never polled)."""
import collections
import glob
import os
import sys


T, G, S = 0.05, 0.25, 1.44
# Each fault's own bound, from the moment it begins to the end of a transfer it hit.
BOUNDS = {
    "link-down": 3 * T + G,          # a port down, seen twice
    "wire0-down": 3 * T + G,
    "wire-drop": S + 2 * T + G,      # no progress, port up (or the provider's retry bound, shorter)
    "rail-stalled": S + 2 * T + G,
    "slow-rail": 0.0,                # slower, not failed
    "qp-destroyed": 2 * T + G,
    "peer-killed": 0.0,              # the other peer goes on
    "owner-killed": S + 2 * T + G,   # every rail at once: the transport's retry bound, or the watch's
}


def number(words, key):
    for w in words:
        if w.startswith(key + "="):
            return float(w.split("=", 1)[1])
    return None


def main(out):
    faults = collections.Counter()
    intervals = []  # (start, kind, end)
    for line in open(os.path.join(out, "faults.log")):
        parts = line.split()
        if len(parts) >= 2:
            faults[parts[1]] += 1
        if len(parts) == 3:
            intervals.append((float(parts[0]), parts[1], float(parts[2])))
    quiet = float(os.environ.get("GPUVERBS_SOAK_QUIET", "3"))
    slack = float(os.environ.get("GPUVERBS_SOAK_SLACK", "1.5"))
    min_faults = int(os.environ.get("GPUVERBS_SOAK_MIN_FAULTS", "5"))
    min_kinds = int(os.environ.get("GPUVERBS_SOAK_MIN_KINDS", "4"))
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
            if words[0] == "peer" and len(words) > 1 and words[1] == "ready":
                life += 1  # a process (a killed peer's next epoch): its resources are its own
    # Transfers of peers that were killed have no summary: count their lines.
    transfers_logged = collections.Counter()
    judged = 0
    ok_ended = {}  # notification -> when its transfer ended
    worst = None   # (margin, line): the transfer that came nearest its bound
    for path in sorted(glob.glob(os.path.join(out, "peer*.log"))):
        for line in open(path):
            w = line.split()
            if not w or w[0] not in ("ok", "failed"):
                continue
            transfers_logged[w[0]] += 1
            t0, t1 = number(w, "t0"), number(w, "t1")
            if t0 is None or t1 is None:
                continue
            if w[0] == "ok" and len(w) >= 5:
                ok_ended[int(w[4])] = t1
            allowed, why = t0 + quiet, "no fault"
            for start, kind, end in intervals:
                # A fault's effects outlast the injector (ports coming back, peers reconnecting, a restarted
                # owner listening again): a transfer that starts within its bound after it still met it.
                if start <= t1 and end + BOUNDS.get(kind, 0.0) + slack >= t0:
                    limit = max(start, t0) + BOUNDS.get(kind, 0.0) + slack
                    if limit > allowed:
                        allowed, why = limit, kind
            judged += 1
            margin = allowed - t1
            if worst is None or margin < worst[0]:
                worst = (margin, f"{os.path.basename(path)} {w[0]} {w[1]} {w[2]} took {t1 - t0:.2f} s ({why})")
            if t1 > allowed:
                violations.append(f"{os.path.basename(path)}: {w[0]} {w[1]} {w[2]} ended {t1 - allowed:.2f} s past "
                                  f"its bound ({why}; it took {t1 - t0:.2f} s)")
    notified = collections.Counter()
    owner_summary = ""
    owner_life = -1
    for line in open(os.path.join(out, "owner.log")):
        words = line.split()
        if words and words[0] == "owner" and len(words) > 1 and words[1] == "ready":
            owner_life += 1  # a killed owner started again: its resources are a new process's
        if words and words[0] == "notified":
            notified[(int(words[1]) << 24) | int(words[2])] += 1
        elif words and words[0] == "owner-summary":
            owner_summary = line.strip()
        elif words and words[0] == "resources":
            resources[("owner", max(owner_life, 0))].append((int(words[1]), int(words[2])))
    owner_kills = [(start, end) for start, kind, end in intervals if kind == "owner-killed"]

    def lost_with_owner(n):
        t1 = ok_ended.get(n)
        return t1 is not None and any(start - 1.0 <= t1 <= end + 1.0 for start, end in owner_kills)

    doubled = [n for n, c in notified.items() if c > 1]
    missing_all = [n for n in ok_notified if notified[n] == 0]
    missing = [n for n in missing_all if not lost_with_owner(n)]
    excused = len(missing_all) - len(missing)
    if sum(faults.values()) < min_faults or len(faults) < min_kinds:
        violations.append(f"the soak made {sum(faults.values())} faults of {len(faults)} kinds: at least "
                          f"{min_faults} of {min_kinds} kinds are needed to prove anything")
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
          f"{len(missing)} missing ({excused} lost with a killed owner); {owner_summary}")
    if worst is not None:
        print(f"chaos-soak: {judged} transfers judged against the faults they met; nearest its bound: "
              f"{worst[1]}, {worst[0]:.2f} s to spare")
    for name, fds, rss in growth:
        print(f"chaos-soak: {os.path.basename(name)}: descriptors {fds:+d}, resident memory {rss:+.1%} after warm-up"
              + ("" if judge_memory else " (not judged: GPUVERBS_SOAK_MEMORY=report)"))
    for v in violations:
        print(f"chaos-soak: VIOLATION {v}")
    print(f"chaos-soak: {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

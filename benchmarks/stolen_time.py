"""How much CPU time the hypervisor took from this machine while a block ran.

On a shared virtual machine other guests can take a large share of the CPU
(10-40 % seen on the 2-core development VMs), which slows every timing; the
benchmarks print it beside their figures.

    with StolenTime() as stolen:
        work()
    print(stolen)            # "steal 12 %" (or "steal n/a" without /proc/stat)
"""


def read_cpu_times():
    """(steal, total) jiffies over all CPUs from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    return fields[7], sum(fields[:8])


class StolenTime:
    """Context manager; .fraction is the stolen share of all CPU time (or None)."""

    def __enter__(self):
        self.start = read_cpu_times()
        self.fraction = None
        return self

    def __exit__(self, *exc):
        end = read_cpu_times()
        if self.start and end and end[1] > self.start[1]:
            self.fraction = (end[0] - self.start[0]) / (end[1] - self.start[1])
        return False

    def __str__(self):
        return "steal n/a" if self.fraction is None else f"steal {100 * self.fraction:.0f} %"

"""tqdm's progress bars, byte for byte as SGLang's loaders print them on stderr.

Two shapes: the weight loaders pass a `bar_format` ending in a newline, so every refresh is
`\\r<line>\\n` and closing repeats the last line plus one more newline; the CUDA-graph capture uses
tqdm's default shape, refreshed in place with `\\r` and one newline at close. Rates are smoothed with
tqdm's exponential moving average, refreshes are rate-limited by its `mininterval`, slow rates are
printed as `s/it`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# SGLang 0.5.16's BAR_FORMAT (utils/common.py); 0.5.6's ended in a newline, so each refresh was a line.
SHARDS_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"
_BLOCKS = " " + "".join(chr(c) for c in range(0x258F, 0x2587, -1))  # " ▏▎▍▌▋▊▉█"
_BAR_WIDTH = 10  # tqdm's width when stderr is not a terminal


def format_interval(seconds: float) -> str:
    mins, s = divmod(int(seconds), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def format_rate(rate: float | None) -> str:
    if not rate:
        return "?it/s"
    inverse = 1 / rate
    return f"{inverse:5.2f}s/it" if inverse > 1 else f"{rate:5.2f}it/s"


def bar_cells(frac: float, width: int = _BAR_WIDTH) -> str:
    nsyms = len(_BLOCKS) - 1
    full, part = divmod(int(frac * width * nsyms), nsyms)
    cells = _BLOCKS[-1] * full
    if full < width:
        cells += _BLOCKS[part] + _BLOCKS[0] * (width - full - 1)
    return cells


def format_meter(n: int, total: int, elapsed: float, rate: float | None, desc: str, bar_format: str | None) -> str:
    if rate is None and elapsed:
        rate = n / elapsed
    frac = n / total if total else 0.0
    remaining = format_interval((total - n) / rate) if rate and total else "?"
    fields = {
        "desc": desc,
        "percentage": frac * 100,
        "n_fmt": str(n),
        "total_fmt": str(total),
        "elapsed": format_interval(elapsed),
        "remaining": remaining,
        "rate_fmt": format_rate(rate),
    }
    if bar_format is not None:
        return bar_format.format(**fields)
    l_bar = (desc if desc.endswith(": ") else desc + ": ") if desc else ""
    l_bar += f"{frac * 100:3.0f}%|"
    r_bar = f"| {n}/{total} [{fields['elapsed']}<{remaining}, {fields['rate_fmt']}]"
    return l_bar + bar_cells(frac) + r_bar


class _Ema:
    """tqdm's EMA with bias correction (smoothing 0.3)."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.last = 0.0
        self.calls = 0

    def add(self, x: float) -> None:
        self.last = self.alpha * x + (1 - self.alpha) * self.last
        self.calls += 1

    def value(self) -> float:
        return self.last / (1 - (1 - self.alpha) ** self.calls) if self.calls else self.last


class Bar:
    """A tqdm bar driven as `for x in tqdm(items)` drives it: `update()` once per finished item.

    As in tqdm's iterator, the count shown (`n`) only catches up when a refresh is due
    (`mininterval`, and tqdm's dynamic `miniters`), so a `set_description` in between shows the
    last printed count.
    """

    def __init__(
        self,
        total: int,
        write: Callable[[str], None],
        desc: str = "",
        bar_format: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        mininterval: float = 0.1,
        maxinterval: float = 10.0,
    ) -> None:
        self.total = total
        self.n = 0
        self.desc = desc
        self.bar_format = bar_format
        self._write = write
        self._clock = clock
        self._mininterval = mininterval
        self._maxinterval = maxinterval
        self._count = 0
        self._miniters = 0.0
        self._start = clock()
        self._last_print_t = self._start
        self._last_print_n = 0
        self._last_len = 0
        self._ema_dn = _Ema()
        self._ema_dt = _Ema()
        self._ema_miniters = _Ema()
        self._overall = False
        self.refresh()

    def _rate(self) -> float | None:
        if self._overall:
            return None
        dt = self._ema_dt.value()
        return self._ema_dn.value() / dt if dt else None

    def render(self) -> str:
        elapsed = self._clock() - self._start
        return format_meter(self.n, self.total, elapsed, self._rate(), self.desc, self.bar_format)

    def refresh(self) -> None:
        line = self.render()
        self._write("\r" + line + " " * max(self._last_len - len(line), 0))
        self._last_len = len(line)

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self.refresh()

    def update(self) -> None:
        self._count += 1
        if self._count - self._last_print_n < self._miniters:
            return
        now = self._clock()
        dt = now - self._last_print_t
        if dt < self._mininterval:
            return
        dn = self._count - self._last_print_n
        self.n = self._count
        if dt and dn:
            self._ema_dn.add(dn)
            self._ema_dt.add(dt)
        self.refresh()
        if self._maxinterval and dt >= self._maxinterval:
            self._miniters = dn * self._mininterval / dt
        else:
            self._ema_miniters.add(dn * (self._mininterval / dt if dt else 1))
            self._miniters = self._ema_miniters.value()
        self._last_print_n = self._count
        self._last_print_t = now

    def close(self) -> None:
        self.n = self._count
        self._overall = True  # tqdm reports the overall rate on its last refresh
        self.refresh()
        self._write("\n")

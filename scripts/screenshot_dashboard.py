"""Take the README's picture of the dashboard: a real local swarm, `gwtf-node status` under tmux, drawn to PNG.

    python scripts/screenshot_dashboard.py --out docs/dashboard.png

It starts a local swarm (1 data node, 2 stages x 2 relays, a small llama),
lets it train, SIGKILLs one relay so that the dashboard has a crash and its
recovery to show, lets it train on, then runs `gwtf-node status` on the data
node (the leader) in a detached tmux session of the given size, captures the
pane with its colours (`tmux capture-pane -e -p`, ANSI escapes), and draws
that text cell by cell with DejaVu Sans Mono (bundled with matplotlib) into
a PNG with Pillow.  The swarm and the tmux session are taken down on exit.
Needs tmux.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib
from PIL import Image, ImageDraw, ImageFont
from rich.color import Color
from rich.style import Style
from rich.terminal_theme import MONOKAI
from rich.text import Text

from gwtf_node.model.manifest import default_manifest, save_manifest
from gwtf_node.runtime.local.swarm import LocalSwarm

FONT_DIR = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"
THEME = MONOKAI
FONT_PX = 15
PAD_PX = 14
SESSION = "gwtf-dashboard-shot"


def wait_records(swarm: LocalSwarm, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(swarm.records()) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the swarm did not record {n} iterations within {timeout_s:.0f} s "
                             f"(see {swarm.workdir}/*/node.log)")
        swarm._check_alive()
        time.sleep(0.5)


def capture(state_dir: Path, cols: int, rows: int, settle_s: float) -> str:
    """`gwtf-node status` on `state_dir` in a tmux pane of cols x rows; the pane's text with ANSI colours."""
    cmd = f"{sys.executable} -m gwtf_node.cli status --state-dir {state_dir} --interval 1"
    env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor")
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "-x", str(cols), "-y", str(rows), cmd],
                   check=True, env=env)
    try:
        time.sleep(settle_s)
        out = subprocess.run(["tmux", "capture-pane", "-e", "-p", "-t", SESSION], check=True, capture_output=True,
                             text=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    return out


def rgb(color: Color | None, default: tuple[int, int, int]) -> tuple[int, int, int]:
    if color is None or color.is_default:
        return default
    return tuple(color.get_truecolor(THEME))


def draw(ansi: str, out: Path, cols: int) -> None:
    """Draw ANSI text cell by cell (foreground, background, bold) into a PNG."""
    lines = ansi.rstrip("\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    regular = ImageFont.truetype(str(FONT_DIR / "DejaVuSansMono.ttf"), FONT_PX)
    bold = ImageFont.truetype(str(FONT_DIR / "DejaVuSansMono-Bold.ttf"), FONT_PX)
    cell_w = round(regular.getlength("M"))
    ascent, descent = regular.getmetrics()
    cell_h = ascent + descent  # no gap between rows: box-drawing lines join up
    fg0 = tuple(THEME.foreground_color)
    bg0 = tuple(THEME.background_color)
    img = Image.new("RGB", (cols * cell_w + 2 * PAD_PX, len(lines) * cell_h + 2 * PAD_PX), bg0)
    pen = ImageDraw.Draw(img)
    for row, line in enumerate(lines):
        text = Text.from_ansi(line)
        styles: list[Style] = [Style()] * len(text.plain)
        for span in text.spans:
            st = span.style if isinstance(span.style, Style) else Style.parse(str(span.style))
            for i in range(span.start, min(span.end, len(styles))):
                styles[i] = styles[i] + st
        y = PAD_PX + row * cell_h
        for col, ch in enumerate(text.plain[:cols]):
            st = styles[col]
            fg, bg = rgb(st.color, fg0), rgb(st.bgcolor, bg0)
            if st.reverse:
                fg, bg = bg, fg
            x = PAD_PX + col * cell_w
            if bg != bg0:
                pen.rectangle([x, y, x + cell_w, y + cell_h], fill=bg)
            if ch != " ":
                if st.dim:
                    fg = tuple((a + b) // 2 for a, b in zip(fg, bg))
                pen.text((x, y), ch, font=bold if st.bold else regular, fill=fg)
    img.save(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/dashboard.png")
    ap.add_argument("--workdir", default=None, help="the swarm's state directories (default: a temporary one)")
    ap.add_argument("--cols", type=int, default=132)
    ap.add_argument("--rows", type=int, default=72)
    ap.add_argument("--iterations-before", type=int, default=4, help="iterations trained before the crash")
    ap.add_argument("--iterations-after", type=int, default=4, help="iterations trained after it")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is not installed: it is the terminal the screenshot is taken in")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gwtf-shot-"))
    workdir.mkdir(parents=True, exist_ok=True)
    man = default_manifest(stages=2, seq_len=32, microbatch_size=2, microbatches_per_iteration=8)
    save_manifest(man, workdir / "run.json")
    swarm = LocalSwarm(workdir, workdir / "run.json", data_nodes=1, stages=2, relays_per_stage=2,
                       iterations=100000)
    try:
        swarm.start()
        wait_records(swarm, args.iterations_before, 300)
        victim = "r1_1"
        swarm.expected_dead.add(victim)
        swarm.procs[victim].send_signal(signal.SIGKILL)
        print(f"killed {victim}; training on", file=sys.stderr)
        wait_records(swarm, args.iterations_before + args.iterations_after, 300)
        ansi = capture(workdir / "d0", args.cols, args.rows, settle_s=4.0)
    finally:
        swarm.stop()
    draw(ansi, Path(args.out), args.cols)
    print(f"wrote {args.out} ({len(ansi.splitlines())} lines captured); swarm state in {workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

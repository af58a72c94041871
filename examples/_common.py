"""What every example shares: the metrics CSV, the learning curve, the target tracker, the summary.

The examples import it by path (``examples/`` is not a package)::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _common import MetricsLog, run_dir, save_learning_curve, summary_line

Each example keeps its own training loop; only the bookkeeping around it lives here.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

# conf/'s group files compose the registered ext_* configs: register them before Hydra composes.
import torchrl_ext.configs  # noqa: F401

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


class MetricsLog:
    """``metrics.csv`` written row by row (flushed, so ``tail -f`` works) and kept in memory.

    Args:
        path: the CSV file (created, or truncated).
        columns: column order; a row with other keys raises.
        target: optional ``(column, threshold)``: :attr:`reached_at` is the ``frames``
            value of the first row whose ``column`` is ``>= threshold``.
    """

    def __init__(self, path: Path, columns: Sequence[str], target: tuple[str, float] | None = None) -> None:
        self.path, self.columns, self.target = Path(path), tuple(columns), target
        self.rows: list[dict[str, float]] = []
        self.reached_at: int | None = None
        self._file = self.path.open("w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns)
        self._writer.writeheader()

    def write(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        self._writer.writerow(row)
        self._file.flush()
        if self.target is not None and self.reached_at is None:
            column, threshold = self.target
            if row[column] >= threshold:
                self.reached_at = int(row["frames"])

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def save_learning_curve(
    rows: Iterable[dict[str, float]],
    path: Path,
    title: str,
    *,
    x: str = "frames",
    y: str = "episode_return",
    target: float | None = None,
) -> None:
    """Plot ``y`` against ``x`` with the Agg canvas (no display, no pyplot global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = list(rows)
    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([r[x] for r in rows], [r[y] for r in rows], marker=".")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.legend(loc="lower right")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")


def greedy_return(policy: Any, env: Any, episodes: int, max_steps: int = 10_000) -> float:
    """Mean return of ``episodes`` episodes played with ``ExplorationType.DETERMINISTIC``
    (the mode of a stochastic policy, the greedy action of an epsilon-greedy one)."""
    import torch
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    returns = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            rollout = env.rollout(max_steps=max_steps, policy=policy, break_when_any_done=True)
            returns.append(float(rollout["next", "reward"].sum()))
    return sum(returns) / len(returns)


def run_result(
    metrics: MetricsLog,
    *,
    frames: int,
    elapsed_s: float,
    output_dir: Path,
    png_path: Path,
    eval_return: float = float("nan"),
    final_return: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """What every ``train()`` returns: the final return (by default the last row's
    ``episode_return``), the target crossing, paths and ``extra``."""
    rows = metrics.rows
    if final_return is None:
        final_return = rows[-1]["episode_return"] if rows else float("nan")
    return {
        "final_return": final_return,
        "eval_return": eval_return,
        "reached_at": metrics.reached_at,
        "frames": frames,
        "elapsed_s": elapsed_s,
        "rows": rows,
        "output_dir": Path(output_dir),
        "csv_path": metrics.path,
        "png_path": Path(png_path),
        **extra,
    }


def run_dir() -> Path:
    """Hydra's run directory of the current ``@hydra.main`` job."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def summary_line(name: str, result: dict[str, Any], target: float | None = None) -> str:
    """One line: the final metric, when the target was first reached, frames and time."""
    parts = [f"{name}: final return {result['final_return']:.1f}"]
    greedy = result.get("eval_return", float("nan"))
    if not math.isnan(greedy):
        parts.append(f"greedy eval {greedy:.1f}")
    if target is not None:
        reached = result.get("reached_at")
        parts.append(
            f"reached {target:g} at frame {reached}" if reached is not None
            else f"did not reach {target:g}"
        )
    parts.append(f"{result['frames']} frames in {result['elapsed_s']:.1f}s")
    parts.append(f"outputs in {result['output_dir']}")
    return "; ".join(parts)

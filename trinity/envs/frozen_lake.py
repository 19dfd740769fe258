"""A text frozen lake: walk a grid from S to G without stepping into a hole H.

The map (size × size, `holes` of its cells holes) is drawn by the reset seed and always has a
path from S to G. Each reply names one move: its last word among up, down, left, right (so
reasoning before the move is allowed). The lake is not slippery: a move goes where it says, a
move into the edge stays put.

Reward: 1 on reaching G; 0 for falling in a hole (the episode ends); -0.1 for a reply naming no
move. Components: "goal", "format".

Trinity-RFT's lake (its `frozen_lake_workflow` arguments, `workflow_args: {env_max_steps: 8,
is_slippery: false}`, rows `{seed, size, p}`): with `p` set, every cell is frozen with
probability `p` (else a hole) instead of a fixed count of holes, S and G are drawn apart, and the
map is drawn again until G is reachable from S in at most `max_steps` moves (Trinity-RFT's
`env_max_steps`; unset: reachable at all). A reset's `options` (the task row) may set `size` and
`p`. `desc` is a fixed map (rows of S, F, H, G). `is_slippery: true`: a move goes the intended
way or either perpendicular way, 1/3 each (gymnasium's FrozenLake), drawn from the episode's
generator (seeded by the reset seed). Departs from Trinity-RFT: the bound is a shortest path
(breadth-first search), where Trinity-RFT's depth-first search may miss a short path and draw
again; a reply naming no move costs 0.1 where Trinity-RFT's costs nothing; the map's drawing
differs, so a seed gives another map than Trinity-RFT's.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from trinity.envs.base import ENV, TextEnv, message

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_PERPENDICULAR = {
    "up": ("left", "right"),
    "down": ("left", "right"),
    "left": ("up", "down"),
    "right": ("up", "down"),
}
_MOVE = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)


def shortest_path(grid: list[str], start: tuple[int, int] | None = None) -> list[str] | None:
    """The moves of a shortest 4-neighbour walk over non-hole cells from `start` (default: S)
    to G (breadth-first search, moves tried in `MOVES` order); None if G cannot be reached."""
    n = len(grid)
    if start is None:
        start = next((r, c) for r in range(n) for c in range(n) if grid[r][c] == "S")
    came: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    todo = deque([start])
    while todo:
        cell = todo.popleft()
        if grid[cell[0]][cell[1]] == "G":
            moves: list[str] = []
            while (back := came[cell]) is not None:
                cell, move = back
                moves.append(move)
            return moves[::-1]
        for move, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if (
                0 <= nxt[0] < n
                and 0 <= nxt[1] < n
                and nxt not in came
                and grid[nxt[0]][nxt[1]] != "H"
            ):
                came[nxt] = (cell, move)
                todo.append(nxt)
    return None


def reachable(grid: list[str]) -> bool:
    """A path of 4-neighbour moves over non-hole cells joins S and G."""
    return shortest_path(grid) is not None


@ENV.register("frozen_lake_text")
class FrozenLakeText(TextEnv):
    system_prompt = (
        "You walk on a frozen lake grid: S start, G goal, H hole, F frozen ice, P you. "
        "Reply with one move: up, down, left or right."
    )
    max_turns = 12

    def __init__(
        self,
        size: int = 4,
        holes: int = 3,
        max_turns: int | None = None,
        p: float | None = None,
        max_steps: int | None = None,
        is_slippery: bool = False,
        desc: list[str] | None = None,
    ) -> None:
        super().__init__(max_turns)
        if size < 2 or not 0 <= holes <= size * size - 2:
            raise ValueError(f"need size >= 2 and 0 <= holes <= size*size-2, got {size}, {holes}")
        if p is not None and not (isinstance(p, int | float) and 0 < p <= 1):
            raise ValueError(f"p (the chance a cell is frozen) must be in (0, 1], got {p!r}")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        if desc is not None:
            _check_desc(desc)
        self.size, self.holes, self.p, self.max_steps = size, holes, p, max_steps
        self.is_slippery, self.desc = bool(is_slippery), desc
        self.grid: list[str] = []
        self.pos = (0, 0)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        if self.desc is not None:
            grid = list(self.desc)
        elif self.p is not None or "p" in options:
            size = int(options.get("size", self.size))
            grid = self._draw_by_chance(size, float(options.get("p", self.p or 0.8)))
        else:
            grid = self._draw_by_count(self.size)
        start = next((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "S")
        self.grid, self.pos, self.turns, self.size = grid, start, 0, len(grid)
        return message(self.render_text()), {}

    def _draw_by_count(self, n: int) -> list[str]:
        """S, G and `holes` holes on distinct cells, drawn again until S and G are joined."""
        while True:  # a few tries at most for sparse holes
            cells = self.np_random.permutation(n * n)
            start, goal, holes = cells[0], cells[1], set(cells[2 : 2 + self.holes].tolist())
            grid = [
                "".join(
                    "S" if i == start else "G" if i == goal else "H" if i in holes else "F"
                    for i in range(r * n, (r + 1) * n)
                )
                for r in range(n)
            ]
            if self._valid(grid):
                return grid

    def _draw_by_chance(self, n: int, p: float) -> list[str]:
        """Trinity-RFT's draw: each cell frozen with probability `p`, S and G apart, drawn
        again until G is within `max_steps` moves of S."""
        if n < 2:
            raise ValueError(f"frozen_lake_text: size must be >= 2, got {n}")
        for _ in range(10_000):
            cells = [["F" if x < p else "H" for x in row] for row in self.np_random.random((n, n))]
            start, goal = self.np_random.choice(n * n, size=2, replace=False)
            cells[start // n][start % n], cells[goal // n][goal % n] = "S", "G"
            grid = ["".join(row) for row in cells]
            if self._valid(grid):
                return grid
        raise ValueError(
            f"frozen_lake_text: no {n}x{n} map with frozen chance {p} has G within "
            f"{self.max_steps} moves of S after 10000 draws"
        )

    def _valid(self, grid: list[str]) -> bool:
        path = shortest_path(grid)
        return path is not None and (self.max_steps is None or len(path) <= self.max_steps)

    def expert_action(self) -> str:
        """The first move of a shortest safe path from here to G (the map is in every
        observation)."""
        path = shortest_path(self.grid, self.pos)
        if not path:
            raise ValueError(f"frozen_lake_text: no path to G from {self.pos} on {self.grid}")
        return path[0]

    def render_text(self) -> str:
        rows = [
            "".join("P" if (r, c) == self.pos else ch for c, ch in enumerate(row))
            for r, row in enumerate(self.grid)
        ]
        return "\n".join(rows) + "\nYour move?"

    def step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        last = self._turn()
        moves = _MOVE.findall(action)
        if not moves:
            comps = {"goal": 0.0, "format": -0.1}
            info = {"reward_components": comps}
            return message("Reply with up, down, left or right."), -0.1, False, last, info
        move = moves[-1].lower()
        if self.is_slippery:  # the intended way or either perpendicular one, 1/3 each
            move = str(self.np_random.choice([move, *_PERPENDICULAR[move]]))
        dr, dc = MOVES[move]
        r, c = self.pos
        r, c = min(max(r + dr, 0), self.size - 1), min(max(c + dc, 0), self.size - 1)
        self.pos = (r, c)
        cell = self.grid[r][c]
        comps = {"goal": float(cell == "G"), "format": 0.0}
        done = cell in "GH"
        text = {"G": "You reached the goal!", "H": "You fell into a hole."}.get(
            cell, self.render_text()
        )
        info = {"reward_components": comps, "cell": cell}
        return message(text), comps["goal"], done, last and not done, info


def _check_desc(desc: Any) -> None:
    """A fixed map: equal rows of S, F, H, G, one S and one G, square."""
    ok = isinstance(desc, list | tuple) and desc and all(isinstance(r, str) for r in desc)
    if not ok or any(len(r) != len(desc) for r in desc) or set("".join(desc)) - set("SFHG"):
        raise ValueError(f"desc: a square map, rows of S, F, H and G, got {desc!r}")
    text = "".join(desc)
    if text.count("S") != 1 or text.count("G") != 1:
        raise ValueError(f"desc: one S and one G, got {desc!r}")

"""A text frozen lake: walk a grid from S to G without stepping into a hole H.

The map (size × size, `holes` of its cells holes) is drawn by the reset seed and always has a
path from S to G. Each reply names one move: its last word among up, down, left, right (so
reasoning before the move is allowed). The lake is not slippery: a move goes where it says, a
move into the edge stays put.

Reward: 1 on reaching G; 0 for falling in a hole (the episode ends); -0.1 for a reply naming no
move. Components: "goal", "format".
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from trinity.envs.base import ENV, TextEnv, message

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
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

    def __init__(self, size: int = 4, holes: int = 3, max_turns: int | None = None) -> None:
        super().__init__(max_turns)
        if size < 2 or not 0 <= holes <= size * size - 2:
            raise ValueError(f"need size >= 2 and 0 <= holes <= size*size-2, got {size}, {holes}")
        self.size, self.holes = size, holes
        self.grid: list[str] = []
        self.pos = (0, 0)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        super().reset(seed=seed)
        n = self.size
        while True:  # redraw until S and G are joined (a few tries at most for sparse holes)
            cells = self.np_random.permutation(n * n)
            start, goal, holes = cells[0], cells[1], set(cells[2 : 2 + self.holes].tolist())
            grid = [
                "".join(
                    "S" if i == start else "G" if i == goal else "H" if i in holes else "F"
                    for i in range(r * n, (r + 1) * n)
                )
                for r in range(n)
            ]
            if reachable(grid):
                break
        self.grid, self.pos, self.turns = grid, divmod(int(start), n), 0
        return message(self.render_text()), {}

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
        dr, dc = MOVES[moves[-1].lower()]
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

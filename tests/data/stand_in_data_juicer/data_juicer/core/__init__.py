"""Ops: keep_flagged (rows whose `flag` is true), stamp_pid (adds this process's pid as
`pid`), sleep {seconds}, die (the process exits 3 at once), fail {message} (raises)."""

import json
import os
import time


class DefaultExecutor:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg

    def run(self) -> None:
        with open(self.cfg["dataset_path"]) as f:
            rows = [json.loads(x) for x in f]
        for op in self.cfg["process"]:
            [(name, args)] = op.items()
            if name == "keep_flagged":
                rows = [r for r in rows if r["flag"]]
            elif name == "stamp_pid":
                rows = [{**r, "pid": os.getpid()} for r in rows]
            elif name == "sleep":
                time.sleep(args["seconds"])
            elif name == "die":
                os._exit(3)
            elif name == "fail":
                raise ValueError(args["message"])
            else:
                raise ValueError(f"Unknown operator {name!r}")
        with open(self.cfg["export_path"], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

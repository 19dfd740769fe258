"""Which Ray nodes a run uses (`cluster.node_num`) and where its compute actors go.

    cluster: {ray_address: auto, node_num: 2, gpu_per_node: 8}

With `node_num` N > 1 the run waits until the cluster it joined has N alive nodes with CPUs,
then uses N of them: the node of this process (the driver) first when it has CPUs, then the
others by node id. The trainer runs on the first; rollout engine i runs on node i mod N, pinned
there (Ray's node affinity), so engines spread over every node. A local instance is always one node: `node_num` > 1 there is an
error at once, naming how to start a cluster. Weights reach engines on other nodes through the
Ray object store (`memory`), files on a shared file system (`checkpoint`), or a collective
group over the network (`nccl`).
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def run_nodes(node_num: int | None, joined_cluster: bool, wait_s: float = 60.0) -> list[str]:
    """The ids of the nodes the run uses ([] for one node: no placement is imposed).

    Waits up to `wait_s` for `node_num` alive nodes (workers may still be joining), then raises
    ConnectionError naming `cluster.node_num` and what the cluster has.
    """
    if node_num is None or node_num <= 1:
        return []
    if not joined_cluster:
        raise ConnectionError(
            f"cluster.node_num={node_num}: this run started a local Ray instance, which is one "
            "node; start a cluster (`ray start --head` here, `ray start --address=<head>:6379` "
            "on each other node) and run with cluster.ray_address: auto (or its address)"
        )
    deadline = time.monotonic() + wait_s
    while True:
        # a node without CPUs (a head started with --num-cpus=0) hosts no compute actor
        alive = [
            n["NodeID"]
            for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0
        ]
        if len(alive) >= node_num:
            break
        if time.monotonic() >= deadline:
            raise ConnectionError(
                f"cluster.node_num={node_num}: the Ray cluster has {len(alive)} alive node(s) "
                "with CPUs "
                f"after waiting {wait_s:.0f}s; join more with `ray start --address=<head>:6379`"
            )
        time.sleep(1.0)
    here = ray.get_runtime_context().get_node_id()
    ordered = ([here] if here in alive else []) + sorted(n for n in alive if n != here)
    return ordered[:node_num]


def node_resources(nodes: list[str]) -> dict[str, float]:
    """CPUs and GPUs of the smallest of `nodes` (what each node can give its actors)."""
    totals = {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")}
    return {
        k: min(float(totals.get(node, {}).get(k, 0.0)) for node in nodes) for k in ("CPU", "GPU")
    }


def on_node(nodes: list[str], i: int) -> dict[str, Any]:
    """Ray options pinning the i-th actor of a kind to node i mod N ({} for one node)."""
    if not nodes:
        return {}
    return {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=False)
    }


def describe(nodes: list[str], engines: int, trains: bool) -> str:
    """One line: which node holds the trainer and which engines."""
    parts = []
    for k, node in enumerate(nodes):
        held = (["trainer"] if trains and k == 0 else []) + [
            f"engine {i}" for i in range(engines) if i % len(nodes) == k
        ]
        parts.append(f"{node[:12]} ({', '.join(held) or 'nothing'})")
    return f"nodes: {len(nodes)}: " + "; ".join(parts)

"""An agent that only knows the `openai` client, trained through `trinity serve`.

    trinity serve --config examples/serve/serve.yaml         # prints the endpoint's URL
    trinity run --config examples/serve/serve.yaml --set mode=train
    python examples/serve/agent.py --url http://127.0.0.1:8010/v1

Each episode is a session (`X-Session-Id`): the agent asks, answers a follow-up, judges its own
episode, posts the reward to /feedback and closes the session with /commit (`group`: the episodes
GRPO compares, `group_size` of them: the group is trained once all are in). After each batch of episodes it waits until the endpoint serves newer weights.
At the end it prints, as JSON, the weights version each call was served with.
"""

from __future__ import annotations

import argparse
import json
import time

import openai


def episode(client: openai.OpenAI, model: str, sid: str, group: str, size: int) -> list[int]:
    head = {"X-Session-Id": sid}
    question = [{"role": "user", "content": "2+3="}]
    first = client.chat.completions.create(
        model=model, messages=question, max_tokens=4, extra_headers=head
    )
    reply = first.choices[0].message.content or ""
    follow = [
        *question,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "sure?"},
    ]
    second = client.chat.completions.create(
        model=model, messages=follow, max_tokens=4, extra_headers=head
    )
    # the agent's own judgement of the episode (any number; here: does an answer say 5)
    answers = reply + (second.choices[0].message.content or "")
    reward = float("5" in answers) + 0.1 * (len(answers) % 3)
    client.post("/feedback", cast_to=object, body={"session_id": sid, "reward": reward, "key": sid})
    commit = {"session_id": sid, "group": group, "group_size": size}
    client.post("/commit", cast_to=object, body=commit)
    return [first.model_version, second.model_version]


def served_version(client: openai.OpenAI, url: str) -> int:
    return client.get(url.removesuffix("/v1") + "/health", cast_to=object)["model_version"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the endpoint's base URL (ends in /v1)")
    p.add_argument("--batches", type=int, default=3, help="batches of episodes to run")
    p.add_argument("--groups", type=int, default=2, help="groups per batch")
    p.add_argument("--group-size", type=int, default=4, help="episodes per group")
    p.add_argument("--wait", type=float, default=300, help="seconds to wait for new weights")
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="-", max_retries=2, timeout=120)
    model = client.models.list().data[0].id
    versions: list[int] = []
    n = 0
    for batch in range(args.batches):
        have = served_version(client, args.url)
        for g in range(args.groups):
            for _ in range(args.group_size):
                versions += episode(client, model, f"ep{n}", f"b{batch}g{g}", args.group_size)
                n += 1
        if batch < args.batches - 1:  # the trainer trains this batch and publishes
            deadline = time.time() + args.wait
            while served_version(client, args.url) <= have:
                if time.time() > deadline:
                    raise SystemExit(f"no new weights within {args.wait} s")
                time.sleep(0.5)
    print(json.dumps({"versions": versions}))


if __name__ == "__main__":
    main()

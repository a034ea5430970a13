"""The GRPO demo's Ray actors: rollout workers and the policy trainer.

:class:`RolloutWorker` takes prompts from the prompt feed itself (as holder ``name``), runs the
:class:`~rl_data.jobs.grpo.policy.StandInPolicy` on each (the call sleeps until each group's
longest rollout is done, and returns the groups in the order they finished), scores every
response against the prompt's ``extra_env_info["ground_truth"]`` with Math-Verify
(:func:`rl_data.rewards.math_reward`) and releases the prompts whose generation failed.

:class:`PolicyTrainer` is one data-parallel rank of the trainer: it computes the GRPO gradients
of its share of a step's groups for a tiny hashed-bigram language model over the response
tokens (advantages: each group's rewards minus their mean, over their standard deviation); the
driver averages the ranks' gradients (an all-reduce) and every rank applies the mean, so all
ranks hold the same weights. Small on purpose; the data flow is real.
"""

from __future__ import annotations

import random
import time
from typing import Any

#: Hash buckets of the trainer's bigram model (token ids are folded into them).
BUCKETS = 2048
EMBED_DIM = 32


def prompt_token_ids(payload: dict[str, Any]) -> list[int]:
    """The rendered prompt's token ids (the DatumSpec row's message log, concatenated)."""
    return [int(t) for message in payload["message_log"] for t in message["token_ids"].tolist()]


class RolloutWorker:
    """One rollout worker (run as a Ray actor; see the module doc)."""

    def __init__(self, name: str, feed_name: str, namespace: str, *, policy: Any, failure_rate: float,
                 seed: int, timeout_s: float) -> None:
        from rl_data.prompt_feed.client import RolloutClient, get_feed

        self.name, self.policy, self.failure_rate = name, policy, failure_rate
        self._rollout = RolloutClient(get_feed(feed_name, namespace), timeout_s=timeout_s, holder=name)
        self._rng = random.Random(f"{seed}/{name}")

    def ready(self) -> str:
        return self.name

    def generate(self, n: int, wait_s: float) -> dict[str, Any]:
        """Take up to ``n`` prompts, roll them out, score them; failed prompts are released.

        Returns ``{"groups": [...] in finishing order, "failed": [uid, ...], "worker": name}``;
        a group is ``{"uid", "key", "ground_truth", "prompt_ids", "responses", "rewards"}``.
        """
        from rl_data.rewards import math_reward

        prompts = self._rollout.take(n, wait_s=wait_s)
        started = time.monotonic()
        groups, failed = [], []
        for prompt in sorted(prompts, key=lambda p: self.policy.group_latency_s(p.key)):
            time.sleep(max(0.0, started + self.policy.group_latency_s(prompt.key) - time.monotonic()))
            if self._rng.random() < self.failure_rate:  # the inference engine lost this request
                self._rollout.release([prompt.uid])
                failed.append(tuple(prompt.uid))
                continue
            truth = str(prompt.payload["extra_env_info"]["ground_truth"])
            responses = self.policy.responses(prompt.key, truth, attempt=prompt.uid[0])  # sampled afresh every epoch
            groups.append({
                "uid": tuple(prompt.uid), "key": prompt.key, "ground_truth": truth,
                "prompt_ids": prompt_token_ids(prompt.payload), "responses": responses,
                "rewards": [math_reward(response, truth) for response in responses],
            })  # fmt: skip
        return {"groups": groups, "failed": failed, "worker": self.name}


class PolicyTrainer:
    """A tiny policy trained with the GRPO loss (run as a Ray actor; see the module doc)."""

    def __init__(self, tokenizer_factory: Any, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self._tokenizer = tokenizer_factory()
        self._embed = torch.nn.Embedding(BUCKETS, EMBED_DIM)
        self._head = torch.nn.Linear(EMBED_DIM, BUCKETS)
        self._optimizer = torch.optim.SGD(self._parameters(), lr=0.1)

    def ready(self) -> bool:
        return True

    def gradients(self, groups: list[dict[str, Any]]) -> dict[str, Any]:
        """The GRPO loss of ``groups`` (this DP rank's share of a step), its gradients (mean over
        the share's responses), the mean reward and the response tokens; nothing is applied."""
        import torch

        losses, tokens, rewards = [], 0, []
        for group in groups:
            reward = torch.tensor(group["rewards"], dtype=torch.float32)
            advantage = (reward - reward.mean()) / (reward.std(unbiased=False) + 1e-6)
            context = group["prompt_ids"][-1:]
            for response, a in zip(group["responses"], advantage):
                ids = context + self._tokenizer.encode(response, add_special_tokens=False)
                buckets = torch.tensor(ids, dtype=torch.long) % BUCKETS
                log_probs = torch.log_softmax(self._head(self._embed(buckets[:-1])), dim=-1)
                token_log_probs = log_probs.gather(1, buckets[1:, None]).squeeze(1)
                losses.append(-a * token_log_probs.mean())
                tokens += len(ids) - 1
            rewards += group["rewards"]
        self._optimizer.zero_grad()
        loss = torch.stack(losses).mean()
        loss.backward()
        grads = [p.grad.detach().clone() for p in self._parameters()]
        return {"grads": grads, "responses": len(losses), "loss": float(loss.detach()), "reward_sum": float(sum(rewards)), "tokens": tokens}

    def apply(self, grads: list[Any]) -> None:
        """One optimizer step with ``grads`` (the all-reduced mean over the DP ranks)."""
        for parameter, grad in zip(self._parameters(), grads):
            parameter.grad = grad.clone()
        self._optimizer.step()
        self._optimizer.zero_grad()

    def _parameters(self) -> list[Any]:
        return [*self._embed.parameters(), *self._head.parameters()]

    def state_dict(self) -> dict[str, Any]:
        """Model and optimizer state (tensors and plain values: loads with ``weights_only=True``)."""
        return {"embed": self._embed.state_dict(), "head": self._head.state_dict(), "optimizer": self._optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._embed.load_state_dict(state["embed"])
        self._head.load_state_dict(state["head"])
        self._optimizer.load_state_dict(state["optimizer"])

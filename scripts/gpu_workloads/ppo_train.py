"""A plain reinforcement-learning script: PPO on a batch of toy environments simulated with NumPy on the host. Each
iteration collects a rollout step by step (the policy on the GPU under `torch.no_grad()`, its actions copied back to
the host every step for the environments to advance), then runs several epochs of minibatch updates of the policy and
value networks with one Adam. argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/ppo_train.py

A step is one Adam step (a minibatch update); `--window-fn collect` windows the rollouts instead.
`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from torch import nn

SIZES = {"gpu": {"envs": 256, "horizon": 64, "obs": 32, "actions": 8, "hidden": 256, "minibatch": 4096},
         "small": {"envs": 8, "horizon": 8, "obs": 6, "actions": 3, "hidden": 16, "minibatch": 16}}


class ToyEnvs:
    """Vectorised environments: the state drifts by the chosen action's direction; reward for staying near zero."""

    def __init__(self, envs: int, obs: int, actions: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.directions = self.rng.standard_normal((actions, obs)).astype(np.float32)
        self.state = self.rng.standard_normal((envs, obs)).astype(np.float32)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.state = 0.9 * self.state + 0.1 * self.directions[action] + 0.05 * self.rng.standard_normal(
            self.state.shape).astype(np.float32)
        return self.state.copy(), -np.square(self.state).mean(axis=1)


class ActorCritic(nn.Module):
    """A policy head and a value head over one trunk."""

    def __init__(self, obs: int, actions: int, hidden: int) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.policy = nn.Linear(hidden, actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        return self.policy(h), self.value(h).squeeze(-1)


def collect(model: ActorCritic, envs: ToyEnvs, horizon: int, device: str) -> dict[str, torch.Tensor]:
    """One rollout of `horizon` steps of every environment."""
    obs, acts, logps, rewards, values = [], [], [], [], []
    state = torch.from_numpy(envs.state).to(device)
    with torch.no_grad():
        for _ in range(horizon):
            logits, value = model(state)
            dist = torch.distributions.Categorical(logits=logits)
            action = dist.sample()
            obs.append(state)
            acts.append(action)
            logps.append(dist.log_prob(action))
            values.append(value)
            next_state, reward = envs.step(action.cpu().numpy())
            rewards.append(torch.from_numpy(reward).to(device))
            state = torch.from_numpy(next_state).to(device)
    returns = torch.stack(rewards).flip(0).cumsum(0).flip(0)
    advantages = returns - torch.stack(values)
    return {"obs": torch.cat(obs), "act": torch.cat(acts), "logp": torch.cat(logps),
            "ret": returns.flatten(), "adv": ((advantages - advantages.mean()) / (advantages.std() + 1e-8)).flatten()}


def main() -> None:
    """Train for the given iterations and print the mean return."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--clip", type=float, default=0.2)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    envs = ToyEnvs(sizes["envs"], sizes["obs"], sizes["actions"])
    model = ActorCritic(sizes["obs"], sizes["actions"], sizes["hidden"]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    for iteration in range(args.iterations):
        batch = collect(model, envs, sizes["horizon"], device)
        count = batch["obs"].shape[0]
        for _ in range(args.epochs):
            for idx in torch.randperm(count, device=device).split(sizes["minibatch"]):
                logits, value = model(batch["obs"][idx])
                dist = torch.distributions.Categorical(logits=logits)
                ratio = (dist.log_prob(batch["act"][idx]) - batch["logp"][idx]).exp()
                adv = batch["adv"][idx]
                policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - args.clip, 1 + args.clip) * adv).mean()
                loss = policy_loss + 0.5 * (value - batch["ret"][idx]).square().mean() - 0.01 * dist.entropy().mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
        print(f"iteration {iteration}: mean return {batch['ret'].mean().item():.3f}")


if __name__ == "__main__":
    main()

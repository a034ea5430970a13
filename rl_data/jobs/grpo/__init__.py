"""The GRPO demo job: rollout workers, dynamic sampling and an oversampling trainer on the prompt feed.

``pipelines/grpo_demo.py`` / ``rl-data grpo-demo``; see :mod:`rl_data.jobs.grpo.demo`.
"""

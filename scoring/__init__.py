"""Scoring, the bottom layer: tasks, rewards, the math and code graders, the sandbox and prompt templates.

Nothing here imports torch or any other layer of the project; the trainer's rewards and ``eval`` call the same
functions (docs/architecture.md).
"""

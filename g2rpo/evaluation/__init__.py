"""Evaluation: deterministic ODE samples on fixed prompts and seeds, scored by reward models; plots."""

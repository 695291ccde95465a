"""Recipes that train drafters for a target: distilled draft model, Medusa heads, EAGLE-style head.

features.py caches the target's features once; medusa.py, eagle.py and draft.py train from that
cache; measure.py reports tau / acceptance / speedup on a fixed Spec-Bench subset.
"""

"""Generic requests that belong to no task domain: the router's background class.

Short chat requests (a joke, a poem, a greeting) resemble short factual questions in the
target's hidden states, so a similarity threshold alone routes them to the QA domain. Fitting
these as one more class that competes with the domains, and sending requests that land on it
to the dense path, keeps them off every domain's skip set (measured in docs/runtime.md). The
list is deliberately broad (writing, code, advice, planning, small talk, arithmetic) and
disjoint from the far-away prompts the routing benchmark checks with.
"""

from __future__ import annotations

__all__ = ["BACKGROUND_PROMPTS"]

BACKGROUND_PROMPTS: tuple[str, ...] = (
    "Write a short poem about the ocean at night.",
    "Can you help me write a cover letter for a marketing job?",
    "Write a Python function that reverses a linked list.",
    "Good morning! What should I cook for dinner tonight?",
    "Give me three tips to sleep better.",
    "Write a story about a dragon who is afraid of heights.",
    "How do I center a div in CSS?",
    "Plan a three-day trip to Rome for me.",
    "Rewrite this sentence to sound more polite: send me the file now.",
    "I feel stressed about my exams. Any advice?",
    "Solve for x: 3x + 7 = 22.",
    "Write an email to my landlord about a broken heater.",
    "Pretend you are a pirate and introduce yourself.",
    "Suggest a name for my new coffee shop.",
    "What are some good exercises for back pain?",
    "Debug this JavaScript: let x = [1,2,3]; x.map(y => y * 2",
    "Write a product description for a bamboo toothbrush.",
    "Thanks for your help earlier!",
    "Create a weekly workout schedule for a beginner.",
    "Write a funny tweet about Mondays.",
    "Explain how to make a paper airplane step by step.",
    "Draft a toast for my best friend's wedding.",
    "Convert this list to JSON: name Alice, age 30, city Paris.",
    "What's a good way to learn to play the guitar?",
)

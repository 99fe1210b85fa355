"""Paper reproductions (``llmsched reproduce PAPER``) and optimality references (issue 7).

Modules are imported on demand; see :mod:`llmsched_gym.reproduce.papers` and ``report``.
"""

PAPERS: tuple[str, ...] = ("jaillet", "echo", "vtc", "wait", "klpm", "distserve", "splitwise")
"""Papers ``llmsched reproduce`` knows (docs/papers.md; distserve and splitwise: docs/disaggregation.md)."""

"""Evaluation metrics that rank against the full item catalogue (never sampled).

Modules: `retrieval` (precision@k / recall@k for two-tower retrieval),
`ranking` (NDCG@k / HIT@k for next-item prediction; Krichene & Rendle 2020).
"""

__all__ = ["baselines", "ranking", "retrieval"]

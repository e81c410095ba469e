"""Evaluation: retrieval metrics on exact k-NN (torch or faiss, one ranking rule; chunked, never
N×N), NMI, proxy–data distances (PFML W2, RSW AvgDTP), the MLRC concatenation helper and
embeddings I/O.

faiss is imported lazily (extra ``dmlrepro[cpu]``; on a GPU k-NN runs in torch). See docs/evaluation.md.
"""

from .clustering import kmeans_assignments, nmi
from .embeddings_io import (
    EmbeddingSet,
    load_embeddings,
    save_embeddings,
    write_json_atomic,
)
from .evaluate import evaluate_embeddings_file
from .knn import knn_search
from .mlrc import concatenate_fold_embeddings
from .proxy_distances import (
    avg_dtp,
    avg_dtp_per_class,
    pfml_proxy_labels,
    proxy_data_w2,
    proxy_data_w2_per_class,
)
from .retrieval import (
    DEFAULT_KS,
    INSHOP_KS,
    RetrievalResult,
    compute_retrieval,
    retrieval_metrics,
    retrieval_metrics_query_gallery,
)

__all__ = [
    "DEFAULT_KS",
    "INSHOP_KS",
    "EmbeddingSet",
    "RetrievalResult",
    "avg_dtp",
    "avg_dtp_per_class",
    "compute_retrieval",
    "concatenate_fold_embeddings",
    "evaluate_embeddings_file",
    "kmeans_assignments",
    "knn_search",
    "load_embeddings",
    "nmi",
    "pfml_proxy_labels",
    "proxy_data_w2",
    "proxy_data_w2_per_class",
    "retrieval_metrics",
    "retrieval_metrics_query_gallery",
    "save_embeddings",
    "write_json_atomic",
]

"""Placement on a multi-node Ray cluster: nodes, placement groups, storage, cluster checks.

- :mod:`.nodes`: which nodes are alive, which node an actor runs on, probing a suspect node;
- :mod:`.placer`: cells and engines in placement-group bundles spread across nodes, and
  replacements placed only on live nodes (retried elsewhere when one dies before it ran);
- :mod:`.storage`: the run's checkpoint directory, an absolute path or an fsspec URL;
- :mod:`.ledger_check`: a ledger URL every node can open, checked before anything is written;
- :mod:`.local`: a local multi-node cluster (``ray.cluster_utils.Cluster``) for drills and tests.
"""

"""The control plane: the main job's story (:mod:`.driver`), supervision behind a step boundary
(:mod:`.supervision`: cells, failover, engine restarts, the rollout manager, the one failure
policy), weight publishing (:mod:`.publisher`), provenance (:mod:`.provenance_recorder`),
placement on a cluster (:mod:`.placement`), the engine pool (:mod:`.engine_pool`), actor
creation (:mod:`.launch`) and reporting (:mod:`.reporting`)."""

"""What an actor needs to run on any node of a cluster: storage every node reads
(:mod:`.checkpoint_io`) and which node it runs on (:mod:`.node_info`)."""

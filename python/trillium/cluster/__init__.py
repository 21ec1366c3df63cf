"""Running several trillium replicas as one service: prefix-cache events for a KV-aware router
(:mod:`.kv_events`) and ``trillium cluster``, replicas behind vllm-router (:mod:`.plan`,
:mod:`.children`, :mod:`.supervise`)."""

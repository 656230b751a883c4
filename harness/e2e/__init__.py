"""End-to-end gate: micro-models, a speculative engine through the registry, the
statistical verdict, and server A/B mode. One job per module:

  tokenizer  character vocabulary shared by training, engine and server
  model      micro-model layouts (DeepSeek-V4 MQA ring, K3 fp8 MLA, Qwen3.5 GQA) + training forward
  train      ``python -m harness.e2e.train``: safetensors + config/data hash beside it
  engine     greedy or sampled, plain or speculative decoding over the KV model, ops via the registry
  drafters   prompt-lookup and n-gram-table drafts, and a controllable noisy drafter
  stats      accuracy intervals, paired exact McNemar, the distribution test of sampled tokens
  gate       per layout and path: rows of ``reports.rows.GateRow``
  power      ``python -m harness.e2e.power``: the sampled gate's distribution test over many seeds
  server / client   OpenAI-compatible loopback server and the A/B client gate
"""

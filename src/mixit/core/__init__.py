"""The core of mixit: the science, read first. Everything outside this package is tooling built on it (the
CLI, studies, tracking, exports, benchmarks, analysis) or what it stands on (errors, registries, files,
devices and processes); nothing in here imports from the tooling.

A reading order, top to bottom of one run:

    config       the options: ModelConfig, TrainConfig, DataConfig
    models/      the decoder and its attention kinds (softmax, MixiT's fixed mixers), with hook points
    freezing     variants: which parameters train, chosen by structure, and the FreezeReport
    tasks/       the tasks and the `Task` contract (text/ holds the corpora and tokenizer they read)
    experiment   RunConfig: a task, a variant and the options resolved into one run, and building it
    training/    the loop: one step, the optimizer, evaluation and the convergence criterion
    run          the run directory (checkpoint: its checkpoints); transplant: a run's attention in a new model
"""

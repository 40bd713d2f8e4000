"""The parts a `trainer.Trainer` is assembled from, each behind a small interface, as in torchtitan's
`components/`.

- `placement`: the device and CPU threads this rank trains with, and the DDP wrapper that keeps the
  replicas equal.
- `training_data`: the decoded set, its train/validation split, the preprocessing fitted to the training part,
  this rank's batch loader and validation shard. It holds no run state: a batch is a function of (seed,
  epoch, step, rank), so the progress counters say where the loader is.
- `training_state`: the model, optimiser, lookahead average and progress counters: all a checkpoint holds,
  each with `state_dict`/`load_state_dict`.
- `training_loop`: the steps of one epoch (learning-rate schedule, loss totals over all ranks, mid-epoch
  checkpoints when the trigger says so).
- `checkpointing`: which checkpoint this run may resume, saving at epoch ends and mid-epoch, and when;
  stopping the group when a newer restart attempt has taken the checkpoints over.
- `resume`: where a restarted run continues, remapped when the world size changed, and how it says so.
- `evaluator`: the validation over all ranks' shards, and the artifacts rank 0 writes at the end.

`trainer.build_trainer` assembles them in the order every rank must follow, since several steps are
collectives or consume the seeded generator.
"""

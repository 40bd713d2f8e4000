"""The pure core: spec + observed children + now -> a plan. No I/O, so every decision is a table test.

Modules, in order (each imports only those before it, and `api/`):
- `observe`: what the children say (workers, their phases, exit codes, progress);
- `status`: the TrainingJob's status written from them (phases, conditions, counts);
- `failure`: the failure and success policies of a fixed-size group;
- `gang`: which gang scheduler, and its group names;
- `builders`: the child manifests (worker Jobs, the headless Service, gang groups, the rendezvous store);
- `admission`: what the operator's flags let a spec ask for;
- `plans`: what one planning pass reads (`Observed`) and decides (`Plan`), and the operator's `Defaults`;
- `queueing`: Kueue, the Workload of a queued TrainingJob and what its state means for the job;
- `steps`: the steps both group policies take (the pass, restarting the whole group, retiring the old
  attempt, cleanup);
- `whole_group`: the fixed-size policy, a failure restarts the whole group;
- `elastic_group`: the elastic policy, one lost worker is replaced alone and spec.workers scales the group;
- `planner`: `plan`, the numbered steps every job shares, then its group's policy.
"""

"""Starting a job and joining it.

- run.py: hbmcoll-run, which starts the ranks of a program on this node (`python -m hbmcoll.run`);
- env.py: who a rank is (rank, size, locality, a job key) from its launcher's environment;
- job_secret.py: the job's secret, which keeps two jobs apart; launcher_secret.py: a job's secret
  drawn by the job and carried by its launcher's store (torchrun);
- job.py: hbmcoll.init(), which joins the job: a communicator over shared memory on one node,
  across nodes the node layer's (hbmcoll/nodes/).
"""

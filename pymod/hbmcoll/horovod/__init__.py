"""The framework-free part of Horovod's API, which hbmcoll.torch and hbmcoll.tensorflow build on:
the op names and the job functions over one communicator (job.py), and process sets (collectives
among a subset of the ranks, process_sets.py)."""

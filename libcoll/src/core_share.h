/*
 * core_share.h - whether another task wants this core (core_share.c), for the node's waits
 * (sync.c), which yield before they sleep.
 */
#ifndef COLL_CORE_SHARE_H
#define COLL_CORE_SHARE_H

/* A yield that took at least this long ran another task's slice: no rank of ours yielding back
 * (bench/README.md has the two kinds of yield measured). */
#define COLL_CORE_YIELD_LONG_S 300e-6
/* A long yield is tested by the thread's next long one this soon after it (core_share.c). */
#define COLL_CORE_CONFIRM_S 1.0
/* After such a yield, waits block instead of yielding for this long, then look again. */
#define COLL_CORE_WANTED_S 1.0

/* CLOCK_MONOTONIC, seconds. */
double coll__core_now(void);

/* sched_yield once; 0 when it came back quickly, 1 when it took COLL_CORE_YIELD_LONG_S or more,
 * 2 when it was long and the test of an earlier long one found a task of this machine held the core
 * (core_share.c), which is then "wanted", for every wait of this process, for
 * COLL_CORE_WANTED_S. */
int coll__core_yield(void);

/* 1 while a long yield of this process was lately confirmed (a task outside the job holds the
 * core between our turns): a wait should block in the kernel rather than yield to it. */
int coll__core_wanted(double now);

#endif /* COLL_CORE_SHARE_H */

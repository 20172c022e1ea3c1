/*
 * core_share.h - whether another task wants this core (core_share.c), for the waits that
 * spin: the node's (sync.c) and the bridge's (net_wait.c).
 */
#ifndef COLL_CORE_SHARE_H
#define COLL_CORE_SHARE_H

/* A yield that took at least this long ran another task's slice: no rank of ours yielding back
 * (bench/README.md has the two kinds of yield measured). */
#define COLL_CORE_YIELD_LONG_S 300e-6
/* After such a yield, waits block instead of yielding for this long, then look again. */
#define COLL_CORE_WANTED_S 1.0
/* A wait on another node yields at most this long before it blocks, even while the yields come
 * back quickly (net_wait.c; the node's waits have their own bound, sync.c). */
#define COLL_CORE_YIELD_FOR_S 0.002

/* CLOCK_MONOTONIC, seconds. */
double coll__core_now(void);

/* sched_yield once; 1 when it took COLL_CORE_YIELD_LONG_S or more (the core is then "wanted",
 * for every wait of this process, for COLL_CORE_WANTED_S), else 0. */
int coll__core_yield(void);

/* A wait saw `gap` seconds pass between two of its polls: taken off the core in between (at
 * COLL_CORE_YIELD_LONG_S or more), which says the core is wanted as a long yield does. */
void coll__core_gap(double gap, double now);

/* 1 while a yield of this process lately took long (a task outside the job holds the core
 * between our turns): a wait should block in the kernel rather than yield to it. */
int coll__core_wanted(double now);

#endif /* COLL_CORE_SHARE_H */

"""Matmul kernel designs and anatomy against the shipped blocked kernel, shape by shape: each variant is a
generated kernel, or a text edit of one, checked against float64 and then timed with `Runtime.time_pass` (back to
back dispatches in one pass) after 2 s of load (an idle H200 runs at 345 MHz).

    python experiments/matmul_designs.py [--check] [--quick]
        [--anatomy | --pipeline | --waves [--big | --wgrad] | --threads | --lanes | --wide] [--budget SECONDS]

Designs (the default):
  checked  the kernel with bounds-checked loads (what shapes off the tile grid run)
  aligned  the shipped kernel for shapes of whole tiles: loads without bounds checks
  const    aligned, with the shape's sizes as literals instead of read from the uniform
  unroll   (double-buffered) aligned, the k loop unrolled by two so that each tile read has a constant buffer
The H200, session 8 (BENCHMARKS.md): aligned beat checked by 9-19% in the double-buffered configurations on the
big model's shapes, 0-3% in the single-buffered ones; const gained nothing; unroll lost 3-20%; thread tiles of
8x16 or 16x8 lost 30-45%.

--anatomy: where a kernel's time goes, each configuration with parts of it cut out (their results, and so
their printed errors, are wrong on purpose: only their time means something):
  noglobal  A and B loads read element 0 (cache hits): what global memory costs
  nolds     also no tile stores and no barriers: the inner loop alone, reading stale tiles
  onetile   also every thread reads the same tile addresses: the inner loop without per-thread index work
  fma       fma() in place of `acc + a * b`
(session 5's table in BENCHMARKS.md, then a script of its own).

--pipeline: the lesson and mid models' training shapes (their epilogues included), every shipped candidate
(BLOCK_CONFIGS: the best is what autotune would pick) against deeper pipelines: BlockConfig.ahead = 2 (global
loads two tiles ahead, a second register set), BlockConfig.spread (vec4 loads along k spread over every thread,
one quad each, instead of a 4 x 4 block on a quarter of them), BK 8 with 128 threads (cuBLAS's 64x64x8 tile,
8x4 per thread), 128x64x8/8x8, and `fragments` (each k's tile reads before the previous k's products). H200,
session 9 (one call: the 2 s heat, then per shape 0.5 s more and the best of 3 rounds; us per call; db =
64x64x16/8x4 vec4 db, the shipped double-buffered candidate; the next columns change one thing at a time):

| shape, layout, epilogue | shipped best | us | db | +ahead2 | +spread | BK 8 ahead2 spread | 4x4 vec4 spread (1 buffer) | ahead2 fragments | split4 ahead2 |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
| 2048x1536x384 B^T bias+GELU | 64x64x16/4x4 | 103.2 | 127.8 | 126.7 | 118.3 | 110.2 | 110.9 | 126.6 | |
| 2048x384x1536 B^T bias+residual | 64x64x16/8x4 split4 | 96.5 | 127.3 | 125.9 | 118.0 | 107.9 | 137.8 | 125.9 | 116.5 |
| 2048x1536x384 nn | 64x64x16/4x4 | 97.6 | 103.0 | 95.7 | 96.9 | 96.2 | 95.4 | 94.5 | |
| 384x1536x2048 A^T row sums | 64x64x16/8x4 split4 | 95.7 | 128.2 | 131.7 | 131.3 | 136.4 | 166.7 | 131.6 | 104.4 |
| 2048x384x1536 nn | 64x64x16/8x4 split4 | 96.7 | 116.0 | 105.7 | 108.8 | 117.3 | 131.2 | 105.7 | 99.1 |
| 1536x384x2048 A^T row sums | 64x64x16/8x4 split4 | 97.1 | 128.6 | 132.0 | 131.7 | 137.0 | 163.7 | 132.1 | 103.5 |
| 2048x1152x384 B^T bias | 32x64x16/4x4 | 77.1 | 108.9 | 108.0 | 101.0 | 84.4 | 88.0 | 106.8 | |
| 2048x384x1152 nn | 128x128x16/8x8 split2 vec4 db unpadded | 77.3 | 88.6 | 80.4 | 82.3 | 88.2 | 98.6 | 80.5 | 79.8 |
| 1152x384x2048 A^T row sums | 128x128x16/8x8 split4 vec4 db unpadded | 65.2 | 85.5 | 88.2 | 87.2 | 98.5 | 113.6 | 87.4 | 74.3 |
| 2048x384x384 B^T bias+residual | 32x64x16/4x4 | 30.5 | 39.6 | 39.6 | 37.3 | 35.5 | 39.7 | 39.0 | |
| 2048x1024x256 B^T bias+GELU | 64x64x16/8x4 | 49.8 | 62.8 | 62.6 | 59.6 | 51.3 | 54.3 | 61.3 | |
| 2048x256x1024 B^T bias+residual | 128x64x32/8x4 split2 | 44.4 | 63.2 | 63.9 | 53.8 | 62.1 | 64.0 | 63.8 | 56.2 |
| 2048x1024x256 nn | 128x64x16/8x4 | 43.1 | 51.9 | 48.6 | 48.6 | 42.2 | 45.4 | 47.6 | |
| 1024x256x2048 A^T row sums | 64x64x32/8x4 split4 vec4 | 45.3 | 84.8 | 87.5 | 87.4 | 98.7 | 112.4 | 87.4 | 41.0 |
| 2048x768x256 B^T bias | 64x64x16/8x4 | 35.2 | 54.6 | 54.9 | 51.8 | 35.1 | 38.2 | 53.8 | |

No design beat the best shipped candidate by 8% on more than one shape: the best new design per shape was
0.91-1.14x of it (0.907: the lesson's 1024x256x2048 weight gradient, 64x64x16/8x4 split4 vec4 db ahead2, 41.0
against 45.3 us; 0.97-0.98: 2048x1536x384 nn, 2048x1024x256 nn). Against the double-buffered kernel they
extend: ahead2 gained 6-9% on every nn shape, lost 3% on the A^T ones, +-1% on B^T; spread then gained 5-16%
where both operands have k contiguous (B^T), -3% to +1% elsewhere; fragments changed nothing (0.97-1.00: the
compiler schedules the unrolled tile reads itself); ahead2 on scalar loads (64x64x16/4x4 db) 0-2% slower;
128x64x8/8x8 db ahead2 lost 5-260% to the best shipped. The winners stay the shipped ones: single-buffered
scalar-load 64x64 and 32x64 blocks where K <= 384, split-K where K >= 1024 (64x64x16/8x4 split4 mostly).

--waves: the same shapes and harness, every shipped candidate against blocks with a side of 96, 48 or 192
(WAVES, WAVES_SPLIT), each on the shapes it tiles whole: their workgroup counts land near a multiple of the
H200's 132 SMs where powers of two leave a partial last wave (2048x1536: 64x64 gives 768 workgroups, 128x128
192, 128x96 256). The lesson's four shapes with sides of 256 and 1024 have none. A table of the best shipped and
best new per shape ends the output. H200, session 11 (one call, the harness above; wg: workgroups, splits
included; the shipped best within 1% of session 9's on every shape):

| shape, layout, epilogue | shipped best | wg | us | best new | wg | us | new / shipped |
| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |
| 2048x1536x384 B^T bias+GELU | 64x64x16/4x4 | 768 | 102.8 | 128x96x16/8x8 vec4 | 256 | 104.8 | 1.020 |
| 2048x384x1536 B^T bias+residual | 64x64x16/8x4 split4 | 768 | 96.1 | 64x96x16/8x4 split2 vec4 db | 256 | 84.6 | 0.881 |
| 2048x1536x384 nn | 64x64x16/4x4 | 768 | 97.7 | 128x96x16/8x8 vec4 | 256 | 87.1 | 0.891 |
| 384x1536x2048 A^T row sums | 64x64x16/8x4 split4 | 576 | 96.0 | 64x96x16/8x4 split2 vec4 db | 192 | 92.3 | 0.961 |
| 2048x384x1536 nn | 64x64x16/8x4 split4 | 768 | 98.0 | 64x96x16/8x4 split2 vec4 db | 256 | 86.2 | 0.880 |
| 1536x384x2048 A^T row sums | 64x64x16/8x4 split4 | 576 | 97.8 | 64x96x16/8x4 split2 vec4 db | 192 | 93.5 | 0.956 |
| 2048x1152x384 B^T bias | 32x64x16/4x4 | 1152 | 77.0 | 64x96x16/8x4 | 384 | 69.0 | 0.896 |
| 2048x384x1152 nn | 128x128x16/8x8 split2 vec4 db unpadded | 96 | 77.7 | 64x96x16/8x4 split2 vec4 db | 256 | 68.3 | 0.879 |
| 1152x384x2048 A^T row sums | 128x128x16/8x8 split4 vec4 db unpadded | 108 | 66.3 | 64x96x16/8x4 split4 | 288 | 90.7 | 1.368 |
| 2048x384x384 B^T bias+residual | 32x64x16/4x4 | 384 | 30.8 | 64x96x16/8x4 vec4 db | 128 | 35.5 | 1.151 |
| 2048x768x256 B^T bias | 64x64x16/8x4 | 384 | 35.2 | 64x96x16/8x4 vec4 db | 256 | 34.7 | 0.984 |

Five of mid's shapes gained 10-12% (the three shipped since: 128x96x16/8x8 vec4, 64x96x16/8x4, 64x96x16/8x4
split2 vec4 db), its 384x1536 and 1536x384 weight gradients 4% (64x96 split2 vec4 db, 192 workgroups; 128x96
split5 vec4 db, 240, was 1.04-1.06), not enough to ship a fourth. Whole waves are not the whole story: 128x96
vec4 (256 workgroups) won by 11% where B's n is contiguous and lost 2% where B is stored transposed (its quads
along k are transposed into the tile), and 96x96 split4 (256) lost 17-29% on those two weight gradients. The
single-wave blocks (128x192x16/8x12, 192x128x16/12x8, 256 threads each) lost 3-8% on 2048x1536 and 1.3-5.7x on
the others; blocks of 48 (64x48x16/4x4, 128x48x16/8x4) won only 2048x1152x384 (0.902, against 0.896 for 64x96).
The generator needed no change for sides that are not powers of two (THREADS_N = 12 or 24; tile copies guarded
where the slots do not divide by the threads).

--waves --big: the big model's twelve training shapes (GPT-2 small: forward B^T with its epilogues, input
gradients nn, fc proj's with GELU's gradient, weight gradients A^T with row sums, K = 2048), every shipped
candidate (all of them: timing them all took ~1 s a shape) against blocks with sides of 96, 144 or 192 along the
sides they tile (M = 2048 takes none: N does), double-buffered 128x192, 192x96 and the like with BK 8 (with BK 16
their tiles pass 32 KB), and splits 2-4 where K >= 1024 or the output is no bigger than 2048x768; blocks giving
fewer than 96 workgroups left out. The heaviest shapes first, and a --budget of
330 s after which shapes are skipped (the run took 116 s in all). H200, session 11 (one call, the harness above;
the per-shape lines of the first seven shapes fell outside the output the call returns, the table did not):

| shape, layout, epilogue | shipped best | wg | us | best new | wg | us | new / shipped |
| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |
| 2048x3072x768 B^T bias+GELU | 64x64x16/8x4 | 1536 | 318.5 | 64x96x16/8x4 vec4 db | 1024 | 349.6 | 1.098 |
| 2048x3072x768 nn GELU gradient | 64x64x16/8x4 | 1536 | 319.4 | 64x96x16/8x4 vec4 db | 1024 | 333.2 | 1.043 |
| 768x3072x2048 A^T row sums | 64x96x16/8x4 split2 vec4 db | 768 | 268.1 | 64x96x16/8x4 vec4 db | 384 | 276.7 | 1.032 |
| 3072x768x2048 A^T row sums | 64x96x16/8x4 split2 vec4 db | 768 | 270.5 | 64x96x16/8x4 split4 vec4 db | 1536 | 282.3 | 1.044 |
| 2048x768x3072 B^T bias+residual | 128x64x16/8x8 split2 | 384 | 269.3 | 64x96x16/8x4 vec4 db | 256 | 301.9 | 1.121 |
| 2048x768x3072 nn | 128x64x16/8x8 split2 | 384 | 266.2 | 64x96x16/8x4 vec4 db | 256 | 291.8 | 1.096 |
| 2048x2304x768 B^T bias | 64x96x16/8x4 | 768 | 244.9 | 64x96x16/8x4 vec4 db | 768 | 234.9 | 0.959 |
| 2048x768x2304 nn | 128x64x16/8x8 split2 | 384 | 205.3 | 64x96x16/8x4 vec4 db | 256 | 221.1 | 1.077 |
| 2304x768x2048 A^T row sums | 128x128x16/8x8 vec4 db unpadded | 108 | 216.4 | 64x96x16/8x4 split4 vec4 db | 1152 | 231.0 | 1.067 |
| 2048x768x768 B^T bias+residual | 64x64x16/8x4 | 384 | 82.6 | 64x96x16/8x4 vec4 db | 256 | 81.5 | 0.987 |
| 2048x768x768 nn | 128x64x16/8x8 split2 | 384 | 85.2 | 64x96x16/8x4 vec4 db | 256 | 79.0 | 0.928 |
| 768x768x2048 A^T row sums | 64x96x16/8x4 split2 vec4 db | 192 | 93.4 | 128x128x16/8x8 split3 vec4 db unpadded | 108 | 84.3 | 0.903 |

Two shapes gained 5% or more, the two smallest (shipped since: 64x96x16/8x4 vec4 db, 128x128x16/8x8 split3 vec4
db unpadded); together about 0.2 ms of a step's ~39 (12 layers each). Whole waves did not pay here: blocks with a
side of 144 or 192 (128x192, 192x96, 96x192, 144x96 and their splits, 96-384 workgroups) lost 9-82% on the last
five shapes (those whose lines came back). The best new block of eleven shapes was a small 64x96 one (vec4 db, or
split4), 256-1536 workgroups: ahead of the shipped best on three (1-7%), 3-12% behind it on the rest, where the
shipped 64x64 and 128x64 split2 run 384-1536 workgroups (several per SM hide latency). The shipped winners are
mid's 64x96 blocks (four shapes), 64x64x16/8x4 and 128x64 split2; 128x128 double-buffered, session 8's winner of
most big shapes, won one (2304x768x2048).

--waves --wgrad: the weight gradients alone (A^T with the row sums, K = 2048): mid's four, the lesson's four, big's
three (WGRAD_SHAPES), every shipped candidate against 51 blocks (WGRAD): splits 3, 6, 8 (16 on the lesson's small
outputs), BK 32 (64x64 double-buffered unpadded at exactly 32 KB; 64x96, 128x64, 96x128, 128x96, 128x128
single-buffered), 8x8 per thread, ahead2; those that tile the shape whole with 48 workgroups or more. H200,
session 11 (one call, the harness above, 57 s in all; the split counts include the finish's dispatch):

| shape, layout, epilogue | shipped best | wg | us | best new | wg | us | new / shipped |
| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |
| 384x1536x2048 A^T row sums | 128x128x16/8x8 split3 vec4 db unpadded | 108 | 83.8 | 128x128x32/8x8 split3 vec4 unpadded | 108 | 92.1 | 1.098 |
| 1536x384x2048 A^T row sums | 128x128x16/8x8 split3 vec4 db unpadded | 108 | 82.8 | 128x128x32/8x8 split3 vec4 unpadded | 108 | 92.3 | 1.114 |
| 1152x384x2048 A^T row sums | 128x128x16/8x8 split4 vec4 db unpadded | 108 | 65.1 | 64x96x16/8x4 split3 vec4 db | 216 | 66.5 | 1.022 |
| 384x384x2048 A^T row sums | 32x64x16/4x4 split8 vec4 db | 576 | 37.1 | 64x64x16/8x4 split6 vec4 db | 216 | 29.8 | 0.801 |
| 1024x256x2048 A^T row sums | 64x64x16/8x4 split4 vec4 db ahead2 | 256 | 41.9 | 128x128x16/8x8 split8 vec4 db unpadded | 128 | 42.7 | 1.018 |
| 256x1024x2048 A^T row sums | 64x64x16/8x4 split4 vec4 db ahead2 | 256 | 41.5 | 128x128x16/8x8 split8 vec4 db unpadded | 128 | 42.2 | 1.018 |
| 768x256x2048 A^T row sums | 64x64x16/4x4 split8 vec4 | 384 | 39.9 | 96x64x16/8x4 split6 vec4 db | 192 | 39.9 | 0.999 |
| 256x256x2048 A^T row sums | 32x64x16/4x4 split8 vec4 db | 256 | 18.2 | 64x64x32/8x4 split8 vec4 db unpadded | 128 | 18.7 | 1.031 |
| 768x3072x2048 A^T row sums | 64x96x16/8x4 split2 vec4 db | 768 | 268.8 | 96x64x16/8x4 split2 vec4 db | 768 | 273.6 | 1.018 |
| 3072x768x2048 A^T row sums | 64x96x16/8x4 split2 vec4 db | 768 | 271.0 | 96x64x16/8x4 split2 vec4 db | 768 | 276.4 | 1.020 |
| 768x768x2048 A^T row sums | 128x128x16/8x8 split3 vec4 db unpadded | 108 | 83.6 | 128x128x32/8x8 split3 vec4 unpadded | 108 | 91.4 | 1.093 |

One shape gained 5% or more: mid's 384x384 (the projection's weight gradient), 37.1 -> 29.8 us with 64x64x16/8x4
split6 vec4 db (shipped since): 216 workgroups of 128 threads, one wave at two per SM, where split 8 (288) took 41.1
and split 3 (108) 34.7. Mid's 384x1536 and 1536x384 were already at 83-84 us with the 128x128 split3 shipped for
big's 768x768 (the --waves table's 92-96 predates it); nothing here came within 9% of it (cuBLAS: ~61). BK 32 lost
to BK 16 at the same block and split on 9-10 of the shapes (0.90-1.20x; 128x128x32 single-buffered against the
shipped 128x128x16 db: 1.09-1.11x); 8x8 per thread lost wherever it meant fewer than 256 threads (64x64x32/8x8, 64
threads: 2.3-2.7x its 8x4; 128x64x32/8x8, 128: 1.2-1.6x); ahead2 cost 0-4% on every shape; splits past the one
wave (8 on mid's big outputs: 1152 workgroups) 1.2-1.4x.

--threads: workgroups of 512 and 1024 threads (THREADS, THREADS_SPLIT: 128x128 blocks of 8x4 or 4x8 per thread,
256x128 and 128x256 of 8x8, 4x4 per thread on 64x128 to 128x128) on the lesson's, mid's and big's 27 training shapes
(PIPELINE_SHAPES + BIG_SHAPES), against every shipped candidate (256 threads or fewer). The question: does a
256-thread 8x8 block leave the H200 short of warps (WGSL cannot bound registers but through the workgroup size)?
H200, session 12 (one call, the harness above, 140 s in all; the adapter allows 1024 threads and 48 KiB): no. The
best new block was 0.97-1.25x the best shipped on the 27 shapes (0.969: 2048x1024x256 nn, 44.6 -> 43.3 us with
128x128x16/8x4 vec4 db unpadded; 0.989 and 1.000 on big's 2048x3072x768 pair; 1.08-1.25x elsewhere); the
1024-thread 4x4 blocks 1.2-2.4x, 256x128 and 128x256 8x8 1.3-2.1x. Nothing was shipped.

--lanes: every shipped candidate with its threads laid out over each warp as CUTLASS's SIMT kernels do (`lanes`: a
4 x 8 grid of thread tiles, lanes8, or 8 x 4, lanes4), against the shipped layout (a warp is one row of THREADS_N
threads and part of the next: 2 distinct A quads and 16 B quads per tile read), on big's 12 training shapes and 10
of mid's. The question: do the tile reads' distinct addresses (the anatomy's `onetile` ran 20% faster) cost the
inner loop? H200, session 14 (one call, 223 s; the harness above): no. The best lanes kernel was 0.989-1.043x the
best shipped on the 22 shapes (0.989: 2048x768x2304 nn, 205.4 -> 203.1 us; 0.991-0.995 on four more; 1.03-1.04 on
the weight gradients); per configuration, lanes over the same configuration's shipped layout, the geometric mean
over the shapes 0.93-1.06 (0.93: 64x64x32/4x4, which no shape picks). Nothing was shipped.

--wide: thread tiles of 8x16 and 16x8 (WIDE, WIDE_SPLIT: 128 results a thread, as cuBLAS's SIMT kernels keep:
256x128x8 with 256 threads, 128x128x8 with 128), BK 8 (16 with 128x128 unpadded), against every shipped candidate
on 4096^2 and big's nine heaviest training shapes. The question: would 64 more accumulators, against 4 more tile
reads a k (6 tile reads for 128 FMAs instead of 4 for 64), raise the ~38 TFLOP/s that every 8x8 configuration tops
out at (experiments/matmul_occupancy.py)? H200, session 15 (one call, 127 s, the harness above): no. The best new
design per shape was 1.02-1.58x the best shipped (1.018: 2304x768x2048 A^T, 204.6 -> 208.1 us, 128x128x8/8x16
split2 vec4 db; 1.047 at 4096^2, 3562 -> 3728 with 128x64x8/8x16 vec4 db; 1.22-1.58 on the other eight); per
design 1.05-3.1x. Nothing was shipped (session 8's 8x16 and 16x8 lost 30-45% too).

--stores (session 14, commit 5d7c001, since removed): every unsplit shipped candidate with each thread's quad of a
row stored as one vec4 (vstore) and with no stores at all (nostore), against the shipped 4 scalar stores, on nine
forward shapes of the three models (no epilogue). H200, session 14 (one call, 74 s): the scalar stores cost nearly
all a store can: vstore over the same configuration 0.71-0.73 for the 128x128 blocks, 0.79 for 128x96, 0.86-0.87 for
64x64/8x4 and 64x96 vec4 db (geometric means over the shapes), nostore 0.01-0.02 below that; best vstore over best
shipped, us: 2048x1536x384 B^T 88.3 -> 70.1 (nn 86.9 -> 67.0), 2048x1024x256 43.2 -> 32.6, 2048x768x256 35.2 ->
28.4, 2048x3072x768 300.0 -> 256.0, 2048x1152x384 70.3 -> 61.4, 2048x2304x768 231.9 -> 214.1 (0.77-0.93). Shipped as
quad stores (the template's `Value`), after which its text edits no longer applied.

--check runs every variant once and prints its error (lavapipe; --waves --big: the aligned kernels, on 1152^2);
--quick: small shapes (--pipeline, --waves: the shapes scaled down, every design timed; add --budget 1 for the
first shape alone).
"""
import re
import sys
import time

import numpy as np

import tinynn_gpu.matmul.blocked as blocked
from tinynn import registry
from tinynn_gpu.matmul.blocked import BlockedMatmul
from tinynn_gpu.matmul.configs import BlockConfig
from tinynn_gpu.matmul.problem import Epilogue


def const(code, shape):
    m, n, k, splits, k_chunk = shape
    for name, v in (("m", m), ("n", n), ("k", k), ("splits", splits), ("k_chunk", k_chunk),
                    ("y_offset", 0), ("z_offset", 0)):
        code = re.sub(rf"params\.{name}\b", f"{v}u", code)
    return code


def unroll(code, shape):
    """Two steps of the k loop per iteration, reading buffer 0 then 1; None for a single-buffered kernel."""
    start = "    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {\n"
    end = "        buf = (buf + 1u) % BUFFERS;\n    }\n"
    i = code.index(start)
    j = code.index(end, i)
    body = code[i + len(start):j]
    if "(1u - buf)" not in body:
        return None
    new = ("    for (var k0 = k_begin; k0 < k_end; k0 = k0 + 2u * BK) {\n        {\n" + re.sub(r"\bbuf\b", "0u", body) +
           "        }\n        if (k0 + BK < k_end) {\n        let k1 = k0 + BK;\n" +
           re.sub(r"\bk0\b", "k1", re.sub(r"\bbuf\b", "1u", body)) + "        }\n    }\n")
    code = code[:i] + new + code[j + len(end):]
    return code.replace("    var buf = 0u;  // the buffer holding this step's tiles\n", "")


def fragments(code, shape):
    """Each k's A and B fragments read from the tile before the previous k's products, not after them (the
    fragments of two k live at once: register double-buffering)."""
    lines = code.split("\n")
    inner = [i for i, line in enumerate(lines)
             if re.match(r"        (let [ab]\d+_\d+ = [ab]_tile|acc_\d+_\d+ = )", line)]
    first, last = inner[0], inner[-1]
    assert inner == list(range(first, last + 1))
    loads, products = {}, {}
    for line in lines[first:last + 1]:
        kk = int(re.search(r"\b[ab](\d+)_\d+", line.split("=")[1] if "acc_" in line else line).group(1))
        (products if "acc_" in line else loads).setdefault(kk, []).append(line)
    body = loads[0]
    for kk in sorted(products):
        body += loads.get(kk + 1, []) + products[kk]
    return "\n".join(lines[:first] + body + lines[last + 1:])


def noglobal(code, shape):
    return re.sub(r"return (a|b)\[\(.*?\)( / 4u)?\];", r"return \1[0u];", code)


def nolds(code, shape):
    code = re.sub(r"(a|b)_tile\[(a|b)_buf\][^=;]*= [^;]*;", "", noglobal(code, shape))
    return code.replace("workgroupBarrier();", "")


def onetile(code, shape):
    return re.sub(r"\[(a|b)_column_\d+\]", "[0u]", nolds(code, shape))


def usefma(code, shape):
    return re.sub(r"(acc_\d+_\d+) = \1 \+ (a\d+_\d+\.[xyzw]) \* (b\d+_\d+);", r"\1 = fma(vec4<f32>(\2), \3, \1);",
                  code)


def lanes(code, lanes_n):
    """A warp's 32 threads own a (32 / lanes_n) x lanes_n grid of the block's thread tiles instead of one row of
    THREADS_N (and a part of the next): each k's tile reads then touch 32 / lanes_n distinct A quads and lanes_n
    distinct B quads a warp, not 2 and 16 (CUTLASS's SIMT kernels use 4 x 8). None where the grid does not tile
    the threads."""
    threads_m = int(re.search(r"const THREADS_M: u32 = (\d+)u;", code).group(1))
    threads_n = int(re.search(r"const THREADS_N: u32 = (\d+)u;", code).group(1))
    lanes_m = 32 // lanes_n
    if threads_n % lanes_n or threads_m % lanes_m:
        return None
    old = "    let tx = lid % THREADS_N;\n    let ty = lid / THREADS_N;\n"
    assert code.count(old) == 1
    warps_n = threads_n // lanes_n
    new = (f"    let tx = (lid / 32u) % {warps_n}u * {lanes_n}u + lid % {lanes_n}u;\n"
           f"    let ty = (lid / 32u) / {warps_n}u * {lanes_m}u + (lid % 32u) / {lanes_n}u;\n")
    return code.replace(old, new)


def lanes8(code, shape):
    return lanes(code, 8)


def lanes4(code, shape):
    return lanes(code, 4)


# each variant: (aligned flag for the generator, an edit of its text or None)
VARIANTS = {"checked": (False, None), "aligned": (True, None), "const": (True, const), "unroll": (True, unroll)}
CUTS = {"base": (True, None), "noglobal": (True, noglobal), "nolds": (True, nolds), "onetile": (True, onetile),
        "fma": (True, usefma)}  # the shipped kernel of these shapes of whole tiles, cut
C = BlockConfig
DB = dict(vec4=True, double=True)
CASES = [  # (M, N, K, A transposed, B transposed): the big model's training shapes, and 4096^2
    ((4096, 4096, 4096, False, False), [C(128, 128, 16, 8, 8, vec4=True), C(128, 128, 16, 8, 8, **DB),
                                        C(128, 128, 8, 8, 8, **DB), C(128, 128, 16, 8, 16, **DB),
                                        C(256, 128, 8, 16, 8, **DB)]),
    ((2048, 3072, 768, False, True), [C(128, 128, 16, 8, 8, vec4=True), C(128, 128, 16, 8, 8, **DB),
                                      C(64, 64, 16, 8, 4, **DB)]),
    ((2048, 768, 3072, False, True), [C(128, 64, 16, 8, 4, vec4=True), C(128, 128, 16, 8, 8, splits=2, **DB)]),
    ((2048, 3072, 768, False, False), [C(128, 128, 16, 8, 8, vec4=True), C(128, 128, 16, 8, 8, **DB)]),
    ((3072, 768, 2048, True, False), [C(128, 128, 16, 8, 8, splits=4, vec4=True), C(128, 128, 16, 8, 8, splits=2, **DB)]),
    ((2048, 2304, 768, False, True), [C(128, 128, 16, 8, 8, vec4=True), C(128, 128, 16, 8, 8, **DB)]),
]
if "--anatomy" in sys.argv:
    VARIANTS = CUTS
    CASES = [((4096, 4096, 4096, False, False), [C(128, 128, 16, 8, 8)]),
             ((2048, 3072, 768, False, True), [C(128, 128, 16, 8, 8)]),
             ((2048, 1024, 256, False, True), [C(64, 64, 16, 4, 4), C(128, 64, 16, 8, 4)])]
if "--quick" in sys.argv:
    CASES = [((256, 256, 256, ta, tb), [C(128, 128, 16, 8, 8, vec4=True), C(64, 64, 16, 8, 4, **DB),
                                        C(64, 64, 16, 4, 4, splits=2, **DB)])
             for ta in (False, True) for tb in (False, True)]


# --pipeline (session 9): the lesson and mid models' training shapes, (M, N, K, A transposed, B transposed,
# epilogue parts), every shipped candidate against deeper pipelines and BK 8; NEW_SPLIT only where K >= 1024
PIPELINE_SHAPES = [
    (2048, 1536, 384, False, True, ("bias", "activation")), (2048, 384, 1536, False, True, ("bias", "residual")),
    (2048, 1536, 384, False, False, ()), (384, 1536, 2048, True, False, ("row_sums",)),
    (2048, 384, 1536, False, False, ()), (1536, 384, 2048, True, False, ("row_sums",)),
    (2048, 1152, 384, False, True, ("bias",)), (2048, 384, 1152, False, False, ()),
    (1152, 384, 2048, True, False, ("row_sums",)), (2048, 384, 384, False, True, ("bias", "residual")),
    (2048, 1024, 256, False, True, ("bias", "activation")), (2048, 256, 1024, False, True, ("bias", "residual")),
    (2048, 1024, 256, False, False, ()), (1024, 256, 2048, True, False, ("row_sums",)),
    (2048, 768, 256, False, True, ("bias",)),
]
NEW = [C(64, 64, 16, 8, 4, **DB, ahead=2), C(64, 64, 16, 4, 4, **DB, ahead=2), C(64, 64, 8, 8, 4, **DB),
       C(64, 64, 8, 8, 4, **DB, ahead=2), C(128, 64, 8, 8, 8, **DB, ahead=2),
       C(128, 128, 16, 8, 8, **DB, pad=False, ahead=2), C(64, 64, 16, 4, 4, vec4=True, spread=True),
       C(64, 64, 16, 4, 4, **DB, spread=True), C(64, 64, 16, 4, 4, **DB, ahead=2, spread=True),
       C(64, 64, 16, 8, 4, **DB, ahead=2, spread=True), C(64, 64, 8, 8, 4, **DB, ahead=2, spread=True),
       C(64, 64, 16, 4, 4, double=True, ahead=2)]
NEW_SPLIT = [C(64, 64, 16, 8, 4, splits=4, **DB, ahead=2), C(64, 64, 16, 4, 4, splits=4, **DB, ahead=2, spread=True),
             C(64, 64, 16, 8, 4, splits=4, **DB, ahead=2, spread=True),
             C(128, 128, 16, 8, 8, splits=2, **DB, pad=False, ahead=2)]
EDITS = [(C(64, 64, 16, 8, 4, **DB), "fragments"), (C(64, 64, 16, 8, 4, **DB, ahead=2), "fragments")]


def pipeline_entries(m, n, k, check):
    """--pipeline's designs for one shape: (config, text edit or None)."""
    return [(c, None) for c in NEW + NEW_SPLIT * (k >= 1024 or check)] + EDITS


# --waves (session 11): blocks with a side of 96, 48 or 192, so that the workgroup count of mid's shapes (sides of
# 384, 1152, 1536) lands just under a multiple of the H200's 132 SMs (x the workgroups resident per SM) instead
# of leaving a partial last wave; each tried on the shapes it tiles whole (an unaligned block would waste its
# edge), split-K only where K >= 1024
WAVES = [C(128, 96, 16, 8, 8), C(128, 96, 16, 8, 8, vec4=True), C(128, 96, 16, 8, 8, **DB),
         C(64, 96, 16, 8, 4), C(64, 96, 16, 8, 4, **DB), C(64, 96, 16, 4, 8), C(32, 96, 16, 4, 4),
         C(64, 48, 16, 4, 4), C(128, 48, 16, 8, 4), C(128, 192, 16, 8, 12), C(128, 192, 16, 8, 12, vec4=True),
         C(96, 96, 16, 8, 8), C(96, 96, 16, 8, 8, **DB), C(96, 128, 16, 8, 8), C(96, 128, 16, 8, 8, **DB),
         C(96, 64, 16, 8, 4), C(192, 128, 16, 12, 8), C(192, 128, 16, 12, 8, vec4=True)]
WAVES_SPLIT = [C(128, 96, 16, 8, 8, splits=2), C(128, 96, 16, 8, 8, splits=2, **DB),
               C(128, 96, 16, 8, 8, splits=4, **DB), C(128, 96, 16, 8, 8, splits=5, **DB),
               C(64, 96, 16, 8, 4, splits=2), C(64, 96, 16, 8, 4, splits=2, **DB), C(64, 96, 16, 8, 4, splits=4),
               C(32, 96, 16, 4, 4, splits=2), C(128, 48, 16, 8, 4, splits=2),
               C(96, 96, 16, 8, 8, splits=4), C(96, 96, 16, 8, 8, splits=4, **DB),
               C(96, 96, 16, 8, 8, splits=5, **DB), C(96, 96, 16, 8, 8, splits=4, **DB, ahead=2),
               C(96, 128, 16, 8, 8, splits=5, **DB), C(96, 64, 16, 8, 4, splits=4, **DB),
               C(192, 128, 16, 12, 8, splits=10, vec4=True), C(192, 96, 16, 12, 8, splits=8, vec4=True)]


def waves_entries(m, n, k, check):
    """--waves' blocks for one shape: those that tile it whole (all of them under --check: their edges too)."""
    return [(c, None) for c in WAVES + WAVES_SPLIT * (k >= 1024 or check)
            if check or (m % c.bm == 0 and n % c.bn == 0)]


# --waves --big (session 11): the big model's training shapes (GPT-2 small: L12 d768, block 256, batch 8), per
# layer: the four forward linears, their input gradients (nn; fc proj's with GELU's gradient in its stores) and
# weight gradients (A^T with the bias gradient's row sums, K = the batch's 2048 tokens); ordered by time, so
# that a run cut short by --budget has the heaviest. The head (2048x65x768 and its gradients) is too small to
# tune (`tune_min_macs`) and tiles by nothing here.
BIG_SHAPES = [
    (2048, 3072, 768, False, True, ("bias", "activation")), (2048, 3072, 768, False, False, ("activation_grad",)),
    (768, 3072, 2048, True, False, ("row_sums",)), (3072, 768, 2048, True, False, ("row_sums",)),
    (2048, 768, 3072, False, True, ("bias", "residual")), (2048, 768, 3072, False, False, ()),
    (2048, 2304, 768, False, True, ("bias",)), (2048, 768, 2304, False, False, ()),
    (2304, 768, 2048, True, False, ("row_sums",)), (2048, 768, 768, False, True, ("bias", "residual")),
    (2048, 768, 768, False, False, ()), (768, 768, 2048, True, False, ("row_sums",)),
]
# M = 2048 tiles only by 32-256, so the blocks 96, 144 or 192 wide go along N (768, 2304, 3072); the weight
# gradients' M (768, 2304, 3072) takes them too. 2048x3072 with 128x192 blocks: 256 workgroups where 128x128
# gives 384; 2048x768 with 128x96: 128 (one wave); 3072x768 with 192x96 split2: 256. Tiles of 16 x (BM + BN)
# double-buffered past 32 KB take BK 8 (or no padding).
BIG = [C(128, 192, 16, 8, 12), C(128, 192, 16, 8, 12, vec4=True), C(128, 192, 8, 8, 12, **DB),
       C(128, 96, 16, 8, 8, **DB), C(64, 96, 16, 8, 4, **DB), C(64, 192, 16, 8, 12),
       C(64, 192, 16, 8, 12, **DB, pad=False), C(128, 144, 16, 8, 12, vec4=True), C(128, 144, 8, 8, 12, **DB),
       C(192, 128, 16, 12, 8), C(192, 128, 16, 12, 8, vec4=True), C(192, 128, 8, 12, 8, **DB),
       C(192, 96, 16, 12, 8, vec4=True), C(96, 192, 16, 8, 12, vec4=True), C(96, 96, 16, 8, 8, **DB),
       C(96, 128, 16, 8, 8, **DB), C(144, 96, 16, 12, 8, vec4=True)]
BIG_SPLIT = [C(128, 96, 16, 8, 8, splits=2, **DB), C(128, 96, 16, 8, 8, splits=3, **DB),
             C(128, 192, 8, 8, 12, splits=2, **DB), C(128, 192, 8, 8, 12, splits=4, **DB),
             C(64, 192, 16, 8, 12, splits=2, **DB, pad=False), C(64, 96, 16, 8, 4, splits=4, **DB),
             C(96, 96, 16, 8, 8, splits=2, **DB), C(96, 96, 16, 8, 8, splits=4, **DB),
             C(192, 96, 8, 12, 8, splits=2, **DB), C(192, 96, 8, 12, 8, splits=4, **DB),
             C(96, 192, 8, 8, 12, splits=2, **DB), C(192, 128, 8, 12, 8, splits=2, **DB),
             C(96, 128, 16, 8, 8, splits=2, **DB), C(144, 96, 16, 12, 8, splits=2, vec4=True),
             C(128, 128, 16, 8, 8, splits=3, **DB, pad=False)]


# --check: every --big block tiles 1152 x 1152 whole and splits K = 192 into whole tiles: the aligned vec4 kernels
# of the three layouts, those the device compiles
BIG_CHECK_SHAPES = [(1152, 1152, 192, False, True, ("bias", "activation")),
                    (1152, 1152, 192, False, False, ("activation_grad",)),
                    (1152, 1152, 192, True, False, ("row_sums",))]


def big_entries(m, n, k, check):
    """--waves --big's blocks for one shape: those that tile it whole with 96 workgroups or more (all under
    --check), split-K where K >= 1024 or the output is no bigger than 2048x768 (two waves of 64x96 blocks)."""
    return [(c, None) for c in BIG + BIG_SPLIT * (k >= 1024 or m * n <= 2048 * 768 or check)
            if check or (m % c.bm == 0 and n % c.bn == 0 and workgroups(c, m, n, k) >= 96)]


# --waves --wgrad (session 11): the weight gradients alone (A^T, the bias gradient's row sums, K = the batch's
# 2048 tokens): mid's four (its largest gap to cuBLAS: 384x1536 and 1536x384 ~92-96 us against ~61), the lesson's
# four, then big's three; the heaviest of each model first. Split counts 3, 6, 8 (and 16 for the lesson's small
# outputs), BK 32 (half the barriers per k; both operands stored with m or n contiguous, so unpadded tiles cost no
# bank conflicts, and a double-buffered 64x64x32 fits 32 KB), 8x8 per thread (4 tile reads a k for 64 products).
WGRAD_SHAPES = [
    (384, 1536, 2048, True, False, ("row_sums",)), (1536, 384, 2048, True, False, ("row_sums",)),
    (1152, 384, 2048, True, False, ("row_sums",)), (384, 384, 2048, True, False, ("row_sums",)),
    (1024, 256, 2048, True, False, ("row_sums",)), (256, 1024, 2048, True, False, ("row_sums",)),
    (768, 256, 2048, True, False, ("row_sums",)), (256, 256, 2048, True, False, ("row_sums",)),
    (768, 3072, 2048, True, False, ("row_sums",)), (3072, 768, 2048, True, False, ("row_sums",)),
    (768, 768, 2048, True, False, ("row_sums",)),
]
DBU = dict(vec4=True, double=True, pad=False)  # unpadded: m and n contiguous, each warp stores whole tile rows
WGRAD = ([C(64, 64, 16, 8, 4, splits=s, **DB) for s in (3, 6, 8)] +
         [C(64, 64, 16, 8, 4, splits=s, **DB, ahead=2) for s in (3, 6, 8)] +
         [C(64, 96, 16, 8, 4, splits=s, **DB) for s in (3, 6)] +
         [C(96, 64, 16, 8, 4, splits=s, **DB) for s in (2, 3, 6)] +
         [C(128, 64, 16, 8, 8, splits=s, **DB) for s in (3, 4, 6, 8)] +
         [C(128, 128, 16, 8, 8, splits=s, **DBU) for s in (6, 8)] +
         [C(128, 96, 16, 8, 8, splits=s, **DB) for s in (3, 6)] +
         [C(96, 128, 16, 8, 8, splits=s, **DB) for s in (3, 6)] +
         # BK 32
         [C(64, 64, 32, 8, 4, splits=s, **DBU) for s in (2, 3, 4, 6, 8)] +
         [C(64, 64, 32, 8, 4, splits=s, **DBU, ahead=2) for s in (4, 8)] +
         [C(64, 64, 32, 8, 8, splits=s, **DBU) for s in (4, 8)] +
         [C(64, 96, 32, 8, 4, splits=s, vec4=True, pad=False) for s in (2, 3, 4)] +
         [C(128, 64, 32, 8, 4, splits=s, vec4=True, pad=False) for s in (2, 4)] +
         [C(128, 64, 32, 8, 8, splits=s, vec4=True, pad=False) for s in (2, 3, 4, 6)] +
         [C(128, 96, 32, 8, 8, splits=s, vec4=True, pad=False) for s in (2, 3, 4)] +
         [C(96, 128, 32, 8, 8, splits=s, vec4=True, pad=False) for s in (2, 3, 4)] +
         [C(128, 128, 32, 8, 8, splits=s, vec4=True, pad=False) for s in (1, 2, 3, 4)] +
         [C(64, 64, 16, 8, 4, splits=16, **DB), C(64, 64, 32, 8, 4, splits=16, **DBU)])
# --check: shapes every WGRAD block tiles whole (aligned kernels; K split whole by 16 or 32) and one off the grid
WGRAD_CHECK_SHAPES = [(384, 384, 512, True, False, ("row_sums",)), (384, 384, 2048, True, False, ("row_sums",)),
                      (100, 70, 333, True, False, ("row_sums",))]


def wgrad_entries(m, n, k, check):
    """--waves --wgrad's blocks for one shape: those that tile it whole with 48 workgroups or more (all under
    --check); split 16 only on outputs of 256 x 1024 or smaller."""
    return [(c, None) for c in WGRAD
            if check or (m % c.bm == 0 and n % c.bn == 0 and workgroups(c, m, n, k) >= 48 and
                         (c.splits < 16 or m * n <= 256 * 1024))]


# --threads (session 12): workgroups of 512 and 1024 threads. Every shipped candidate has 256 or fewer, and nothing
# in WGSL bounds a kernel's registers per thread but the workgroup size: a 256-thread 8x8 block may take more
# registers than two workgroups per SM allow (8 warps resident), where 512 threads must fit 128 registers each
# (16 warps a workgroup). 128x128 blocks of 8x4 or 4x8 per thread keep the 128x128 tile's loads per product with
# twice the warps; 256x128 / 128x256 blocks of 8x8 double the tile; 4x4 per thread on 512 or 1024 threads.
THREADS = [C(128, 128, 16, 8, 4), C(128, 128, 16, 8, 4, vec4=True), C(128, 128, 16, 8, 4, **DBU),
           C(128, 128, 16, 4, 8, vec4=True), C(128, 128, 16, 4, 8, **DBU),
           C(64, 128, 16, 4, 4), C(64, 128, 16, 4, 4, **DB), C(128, 64, 16, 4, 4), C(128, 64, 16, 4, 4, **DB),
           C(256, 128, 16, 8, 8, vec4=True, pad=False), C(256, 128, 8, 8, 8, **DB),
           C(128, 256, 16, 8, 8, vec4=True, pad=False), C(256, 64, 16, 8, 4, vec4=True),
           C(128, 128, 16, 4, 4, vec4=True), C(128, 128, 16, 4, 4, **DBU)]
THREADS_SPLIT = [C(128, 128, 16, 8, 4, splits=s, **DBU) for s in (2, 3, 4)] + \
    [C(64, 128, 16, 4, 4, splits=4, **DB), C(128, 64, 16, 4, 4, splits=4, **DB), C(128, 128, 16, 4, 4, splits=2, **DBU)]


def threads_entries(m, n, k, check):
    """--threads' blocks for one shape: those that tile it whole with 64 workgroups or more (all under --check),
    split-K where K >= 1024."""
    return [(c, None) for c in THREADS + THREADS_SPLIT * (k >= 1024 or check)
            if check or (m % c.bm == 0 and n % c.bn == 0 and workgroups(c, m, n, k) >= 64)]


# --lanes (session 14): every shipped candidate with its threads' tiles laid out over a warp as a 4 x 8 grid
# (lanes8) or 8 x 4 (lanes4), on the mid and big models' training shapes
def lanes_entries(m, n, k, check):
    from tinynn_gpu.matmul.configs import BLOCK_CONFIGS
    return [(c, edit) for c in BLOCK_CONFIGS for edit in ("lanes8", "lanes4")
            if lanes(blocked.generate(c, False, False), 8 if edit == "lanes8" else 4) is not None]


# --wide (session 15): 128 results a thread, on 4096^2 and big's heaviest shapes
WIDE = [C(128, 128, 8, 8, 16), C(128, 128, 8, 8, 16, vec4=True), C(128, 128, 8, 8, 16, **DB),
        C(128, 128, 16, 8, 16, **DB, pad=False), C(128, 128, 8, 16, 8, **DB), C(128, 128, 8, 16, 8, vec4=True),
        C(256, 128, 8, 16, 8, **DB), C(128, 256, 8, 8, 16, **DB), C(128, 64, 8, 8, 16, **DB),
        C(64, 128, 8, 8, 16, **DB)]
WIDE_SPLIT = [C(128, 128, 8, 8, 16, splits=2, **DB), C(128, 128, 8, 16, 8, splits=2, **DB)]
WIDE_SHAPES = [(4096, 4096, 4096, False, False, ())] + BIG_SHAPES[:9]


def wide_entries(m, n, k, check):
    """--wide's blocks for one shape: those that tile it whole (all under --check), split-K where K >= 1024."""
    return [(c, None) for c in WIDE + WIDE_SPLIT * (k >= 1024 or check)
            if check or (m % c.bm == 0 and n % c.bn == 0)]


def workgroups(config, m, n, k):
    return -(-m // config.bm) * -(-n // config.bn) * max(1, min(config.splits, -(-k // config.bk)))


def pipeline(gpu, entries_for=pipeline_entries, shapes=PIPELINE_SHAPES, check_shapes=None, rounds=3,
             budget=float("inf")):
    """--pipeline, --waves: per shape of `shapes` the best shipped candidate (what autotune would pick) against
    each new design (entries_for(m, n, k, check) lists them), the best of `rounds` rounds, then a table of the best
    of each. Shapes are skipped once `budget` seconds have passed (the table still printed). --check: each design
    once on `check_shapes` (by default six of the shapes scaled down, and three odd ones), its error printed;
    --quick: every design timed on the shapes scaled down; --budget SECONDS overrides `budget`."""
    from tinynn_gpu.matmul.configs import BLOCK_CONFIGS
    rt = gpu.rt
    g = np.random.default_rng(0)
    shipped_generate = blocked.generate
    kernels = {}  # (config, edit) -> BlockedMatmul, shared by the shapes (one module per layout)

    def kernel(config, edit):
        if (config, edit) not in kernels:
            kernels[config, edit] = BlockedMatmul(rt, config)
        return kernels[config, edit]

    def generator(edit):
        def generate(cfg, ta, tb, vec4=False, aligned=False, quads=False):
            code = shipped_generate(cfg, ta, tb, vec4, aligned, quads)
            return code if edit is None else globals()[edit](code, None)
        return generate
    check = "--check" in sys.argv
    if check:
        shapes = check_shapes or [(m // 8, n // 8, k, *rest) for m, n, k, *rest in shapes[:6]] + \
            [(100, 70, 333, False, True, ()), (70, 100, 333, False, False, ()), (100, 70, 333, True, False, ())]
        budget = float("inf")
    quick = "--quick" in sys.argv and not check
    if quick:  # (K quartered too where it is past 1536: lavapipe)
        shapes = [(m // 8, n // 8, k if k <= 1536 else k // 4, *rest) for m, n, k, *rest in shapes]
    if "--budget" in sys.argv:
        budget = float(sys.argv[sys.argv.index("--budget") + 1])
    run_started = time.perf_counter()
    heat = 2.0  # seconds of load before the first shape's timing (the clock), less before the next ones'
    table, ratios = [], {}  # ratios: shape -> new design -> its time over the best shipped candidate's
    for m, n, k, ta, tb, parts in shapes:
        label = f"{m}x{n}x{k} ta={ta:d} tb={tb:d} {'+'.join(parts) or '-'}"
        new = entries_for(m, n, k, check or quick)  # (quick: all of them, whether they tile the shape or not)
        if time.perf_counter() - run_started > budget:
            print(f"{label}: skipped, past the budget of {budget:.0f} s", flush=True)
            continue
        if not new:
            print(f"{label}: no new design for this shape", flush=True)
            continue
        started = time.perf_counter()
        a_host = g.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b_host = g.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        want = (a_host.T if ta else a_host).astype(np.float64) @ (b_host.T if tb else b_host)
        a, b, out = gpu.from_numpy(a_host), gpu.from_numpy(b_host), rt.empty((m, n))
        epilogue = Epilogue(
            bias=gpu.from_numpy(g.standard_normal(n, dtype=np.float32)) if "bias" in parts else None,
            activation="gelu" if "activation" in parts else None,
            pre=rt.empty((m, n)) if "activation" in parts else
            gpu.from_numpy(g.standard_normal((m, n), dtype=np.float32)) if "activation_grad" in parts else None,
            residual=gpu.from_numpy(g.standard_normal((m, n), dtype=np.float32)) if "residual" in parts else None,
            row_sums=rt.empty((m,)) if "row_sums" in parts else None,
            activation_grad="gelu" if "activation_grad" in parts else None)
        entries = ([] if check else [(c, None) for c in BLOCK_CONFIGS]) + new
        runs = []
        for config, edit in entries:
            variant = kernel(config, edit)
            blocked.generate = generator(edit)  # compiles with it on first use of a layout
            variant.record(a, b, out, 1, m, n, k, ta, tb, True)  # the plain product, checked
            err = np.abs(gpu.to_numpy(out) - want).max() / np.abs(want).max()

            def call(variant=variant, a=a, b=b, out=out, m=m, n=n, k=k, ta=ta, tb=tb, epilogue=epilogue):
                variant.record(a, b, out, 1, m, n, k, ta, tb, True, epilogue)
            call()
            if epilogue.row_sums is not None:  # the bias gradient's sums checked too (the epilogue's one output)
                want_rows = (a_host.T if ta else a_host).astype(np.float64).sum(axis=1)
                err = max(err, np.abs(gpu.to_numpy(epilogue.row_sums) - want_rows).max() / np.abs(want_rows).max())
            name = config.name + (f" {edit}" if edit else "")
            runs.append((name, config in BLOCK_CONFIGS and edit is None, call, err, workgroups(config, m, n, k)))
        blocked.generate = shipped_generate
        if check:
            for name, _, _, err, groups in runs:
                print(f"{label:<42} {name:<40} {groups:5d} wg err {err:.1e}", flush=True)
                assert err < 1e-4, f"{label} {name}: error {err:.1e}"
            continue
        rt.sync()
        compiled = time.perf_counter()
        heat_until = compiled + heat
        while time.perf_counter() < heat_until:  # all of them: the clock up, every code path warm
            for _, _, call, _, _ in runs:
                call()
            rt.sync()
        heat = 0.5
        times = {}
        for _ in range(rounds):  # rounds over all of them, the best of each kept: a drifting clock hits all alike
            for name, _, call, _, _ in runs:
                times[name] = min(times.get(name, float("inf")), rt.time_pass(call, 10) * 1e3)
        best = min((name for name, shipped, _, _, _ in runs if shipped), key=times.get)
        best_new = min((name for name, shipped, _, err, _ in runs if not shipped and err < 1e-4), key=times.get)
        groups = {name: wg for name, _, _, _, wg in runs}
        table.append((label, best, times[best], groups[best], best_new, times[best_new], groups[best_new]))
        ratios[label] = {name: times[name] / times[best] for name, shipped, _, err, _ in runs
                         if not shipped and err < 1e-4}
        print(f"{label}: shipped best {best} {times[best]:.1f} us ({2 * m * n * k / times[best] / 1e6:.1f} TFLOP/s,"
              f" {groups[best]} wg) [setup {compiled - started:.1f} s, timing {time.perf_counter() - compiled:.1f} s]")
        for name, shipped, _, err, wg in runs:
            if not shipped:
                print(f"    {name:<46} {wg:5d} wg {times[name]:7.1f} us {times[name] / times[best]:5.3f} err {err:.1e}"
                      f"{' WRONG' if err >= 1e-4 else ''}")
        print("    shipped: " + ", ".join(f"{name} {times[name]:.1f}" for name, shipped, _, _, _ in
                                          sorted(runs, key=lambda r: times[r[0]]) if shipped), flush=True)
    if table:
        print("\n| shape, layout, epilogue | best shipped | wg | us | best new | wg | us | new / shipped |")
        print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
        for label, best, t, wg, best_new, t_new, wg_new in table:
            print(f"| {label} | {best} | {wg} | {t:.1f} | {best_new} | {wg_new} | {t_new:.1f} | {t_new / t:.3f} |")
        names = list(dict.fromkeys(name for row in ratios.values() for name in row))  # each design across shapes
        print("\nnew / shipped best per design (columns: the shapes above, in order):")
        for name in names:
            print(f"{name:<46}" + "".join(f" {ratios[label][name]:5.2f}" if name in ratios[label] else "     -"
                                          for label in ratios))


def main():
    gpu = registry.select("gpu")
    if "--pipeline" in sys.argv:
        return pipeline(gpu)
    if "--threads" in sys.argv:
        return pipeline(gpu, threads_entries, PIPELINE_SHAPES + BIG_SHAPES, WGRAD_CHECK_SHAPES[:1] + BIG_CHECK_SHAPES,
                        budget=240.0)
    if "--lanes" in sys.argv:
        return pipeline(gpu, lanes_entries, BIG_SHAPES + PIPELINE_SHAPES[:10], budget=330.0)
    if "--wide" in sys.argv:
        return pipeline(gpu, wide_entries, WIDE_SHAPES, [(256, 256, 64, ta, tb, ()) for ta in (0, 1) for tb in (0, 1)],
                        budget=210.0)
    if "--waves" in sys.argv and "--wgrad" in sys.argv:
        return pipeline(gpu, wgrad_entries, WGRAD_SHAPES, WGRAD_CHECK_SHAPES, budget=200.0)
    if "--waves" in sys.argv and "--big" in sys.argv:
        return pipeline(gpu, big_entries, BIG_SHAPES, BIG_CHECK_SHAPES, budget=330.0)
    if "--waves" in sys.argv:
        return pipeline(gpu, waves_entries)
    rt = gpu.rt
    g = np.random.default_rng(0)
    shipped = blocked.generate
    runs = []
    for (m, n, k, ta, tb), configs in CASES:
        a_host = g.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b_host = g.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        want = (a_host.T if ta else a_host).astype(np.float64) @ (b_host.T if tb else b_host)
        a, b, out = gpu.from_numpy(a_host), gpu.from_numpy(b_host), rt.empty((m, n))
        for config in configs:
            splits = max(1, min(config.splits, -(-k // config.bk)))
            shape = (m, n, k, splits, -(-k // (splits * config.bk)) * config.bk)
            for name, (aligned, edit) in VARIANTS.items():
                def generate(cfg, ta, tb, vec4=False, shape_aligned=False, quads=False, aligned=aligned, edit=edit,
                             shape=shape):
                    """The variant's kernel: its own `aligned`, not the shape's answer (shape_aligned)."""
                    code = shipped(cfg, ta, tb, vec4, aligned, quads)
                    return code if edit is None else edit(code, shape)
                if generate(config, ta, tb, True) is None:
                    continue
                blocked.generate = generate
                variant = BlockedMatmul(rt, config)  # compiles its module with this generator on first use
                def call(variant=variant, a=a, b=b, out=out, m=m, n=n, k=k, ta=ta, tb=tb):
                    variant.record(a, b, out, 1, m, n, k, ta, tb, True)
                call()
                err = np.abs(gpu.to_numpy(out) - want).max() / np.abs(want).max()  # (meaningless for the cuts)
                label = f"{m}x{n}x{k} ta={ta:d} tb={tb:d} {config.name:<28} {name:<8}"
                runs.append((label, 2 * m * n * k, call, err))
    blocked.generate = shipped
    rt.sync()
    if "--check" in sys.argv:
        for label, flops, call, err in runs:
            print(f"{label} err {err:.1e}")
        return
    heat_until = time.perf_counter() + 2.0
    while time.perf_counter() < heat_until:
        runs[0][2]()
        rt.sync()
    for label, flops, call, err in runs:
        ms = min(rt.time_pass(call, 10) for _ in range(3))
        print(f"{label} {ms * 1e3:8.1f} us {flops / ms / 1e9:5.1f} TFLOP/s err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()

"""Checks every GPU path of knapformer on this machine and reports which are right.

    python -m knapformer.gpu_check                                # one GPU, world size 1
    torchrun --nproc_per_node N -m knapformer.gpu_check           # N GPUs (N >= 2)
    python -m knapformer.gpu_check --dry-run                      # what would run here
    python -m knapformer.gpu_check --device cpu [--ranks 4]       # self-test of the checks

Nothing here has run on a GPU before this command does: it is the one command
a user with GPUs runs to tell whether the package's CUDA paths (the trainer's
ProcessGroupNCCL, the raw NCCL transport, stream ordering, host syncs, copy
and exchange speed, a dead peer) behave as the CPU tests say they should.

Checks (one row each in the report; PASS/FAIL are verdicts, INFO rows are
figures, SKIP rows say why they did not run):

  nccl_group   ProcessGroupNCCL at the world's size (one GPU: world size 1 on
               a TCPStore made in-process), an all_reduce on it, and a
               SequenceBalancer over it: this_device is the rank's GPU, the
               routed rows are exactly the planner's chunk table and come
               back bit-exact. PASS/FAIL; figure: init_s (group creation and
               first collective).
  raw_nccl     The extension's raw NCCL transport (knapformer._C.NcclTransport,
               only in CUDA builds): an all-to-all of rows of 24 and 7 bytes
               (some rank pairs empty) must arrive bit-exact; rank 0 then
               declares one row more than its peer sends, which must raise
               ValueError with the same message on every rank, leave the
               transport usable (not aborted) and the next exchange exact;
               all_gather_bytes must return every rank's bytes. PASS/FAIL.
  python_step  A full Python step against the same model run unbalanced, in
               float64, for each topology that fits the world (world size N:
               g1nN, g1n{N/2}+g{N/2}n1, gNn1): plan_routing, route of the tokens
               with float32 positions, int64 token ids and a bf16 column as
               features, pre_attn, a per-sequence (varlen) attention,
               post_attn, reverse_route, backward. Routing must be bit-exact
               (routed ids equal the planner's table, chunk lengths, the round
               trip of every dtype, gradients of the round trip); outputs and
               input, weight and feature-weight gradients must equal the
               unbalanced model's within rtol 1e-10, atol 1e-12. PASS/FAIL;
               figure: max_rel_diff. Runs on CPU too (--device cpu).
  side_stream  Stream order. The input is filled on a non-blocking side stream
               behind a ~50 ms kernel (torch.cuda._sleep), the current stream
               waits for it (current.wait_stream(side)), then route: the
               routed rows must be the filled values, which proves the
               exchange is ordered after the caller's stream and not run early
               on another one. Then the route's output (and reverse_route's)
               consumed at once on the current stream, and the whole call made
               with the side stream current: values right. With the raw
               transport, the same for all_to_all_rows given the stream
               handle. PASS/FAIL; figure: route_host_ms (how long route held
               the host while the GPU slept; about the sleep means a sync).
  host_syncs   Host synchronisations per balanced step (route, pre_attn,
               post_attn, reverse_route and the backward pass; plan_routing
               counted apart), counted with torch.profiler (CPU and CUDA
               activities): CUDA runtime calls cudaStreamSynchronize,
               cudaDeviceSynchronize, cudaEventSynchronize and cudaMemcpy
               (synchronous; not cudaMemcpyAsync) inside each call, averaged
               over 3 steps after 2 warm-up steps; attention is stood in for by
               elementwise work that syncs nothing. INFO (figures:
               syncs_per_step, in_<call>, calls_<runtime call>); SKIP when the
               profiler cannot start or records no CUDA runtime calls (no
               CUPTI).
  sync_debug   The same step under torch.cuda.set_sync_debug_mode("error")
               around each of route, pre_attn, post_attn, reverse_route and
               the backward (after plan_routing and 2 warm-up steps): the first
               call that makes a synchronising CUDA call is named with torch's
               message, every rank stopping at it; "nothing raised" is 0 host
               syncs per step. INFO (figure: raised, 0 or 1); SKIP where
               set_sync_debug_mode is not usable.
  exchange_cost  Per call of the same step (route, pre_attn, post_attn,
               reverse_route, backward): the host microseconds it takes while
               the GPU is still busy (a 50 ms sleep kernel enqueued right after
               plan_routing, so a call that waits for the GPU shows about 50 ms;
               on CPU, the call's own time), median of 3 steps, and the kernel
               launches and memcpys (memsets included) it enqueues, counted in
               a torch.profiler trace (CUDA runtime calls; on CPU not counted,
               said so). INFO (figures: host_us_<call>, kernels_<call>,
               memcpys_<call>). Runs on CPU too.
  copy_bandwidth  route + reverse_route of one tensor (--copy-mb, 64 MB; CPU 4)
               where every token stays on its device (one-rank group), against
               dst.copy_(src) twice of the same bytes and against two
               dist.all_to_all_single on a group of one (the collective's own
               self-exchange): CUDA events (the clock on CPU), median of
               --repeats; GB/s of each, ratio (to the copies) and ratio_a2a.
               INFO. Runs on CPU too.
  hub_layout   An 8-rank layout with multi-GPU bags (g1n2+g2n1+g4n1) played on
               this rank's one device: 8 balancers in this process, one thread
               each, over a tensor hub whose exchanges copy rows between
               tensors on the device (NCCL refuses two ranks on one GPU), so
               the device path of a multi-GPU world runs here (packing,
               indexing, unpacking, the bags' Ulysses exchanges). 2 steps of
               plan_routing, route of float64 rows and int64 token ids,
               pre_attn of q, k, v, post_attn, reverse_route and the
               exchanges' backward (route, pre_attn): routed ids must be the
               planner's chunk table, each attention sequence one sequence's
               tokens in order with the position's heads, every round trip and
               backward bit-exact. PASS/FAIL; figures: ranks, moved_tokens,
               step_ms (one simulated rank's step, the ranks sharing the
               device and the host's threads). Runs on CPU too.
  route_vs_all_to_all  With 2 or more ranks: route + reverse_route against two
               bare dist.all_to_all_single calls with the plan's own splits
               (topology gNn1: every sequence spread over every rank), at each
               --sizes-mb per rank (1 and 16 MB; CPU: 0.25 and 1), slowest
               rank per repeat, median of --repeats; both times and their
               ratio. INFO. Runs on CPU too.
  fsdp2_checkpoint  The training setup of issue 35: a 2-block float64 model
               with one MLP per modality in each block, non-reentrant
               activation checkpointing on every block, and fully_shard (FSDP2)
               on every modality MLP, every block and the model;
               route/reverse_route around the blocks and pre_attn/post_attn in
               each (topology with multi-GPU bags from 2 ranks on: the mix
               g1n{N/2}+g{N/2}n1 or gNn1), 3 steps, one where only rank 0 has
               a sequence (5 tokens) and a rank with no tokens of one
               modality. Outputs, input gradients and every rank's own shards
               of the parameter gradients must equal the same model's run
               unbalanced within rtol 1e-10. PASS/FAIL (the largest
               difference); figures: max_rel_diff, moved_tokens. SKIP with
               torch's own error where this torch has no fully_shard, or where
               fully_shard cannot run a plain Linear here (on CPU with torch
               2.6 its streams have no record_event). Runs on CPU too where
               fully_shard does.
  compiled_block  torch.compile(fullgraph=True, dynamic=None, backend
               aot_eager) of one attention block calling pre_attn and
               post_attn (routes eager), 8 steps of changing lengths, float64:
               outputs and gradients equal the unbalanced eager block's within
               rtol 1e-10, no graph break, and no compile after step 3
               (counted from 0). PASS/FAIL; figures: compiles, graph_breaks,
               max_rel_diff. SKIP where torch has no torch.library.custom_op
               (before 2.4: the exchanges cannot be custom ops). Runs on CPU
               too.
  killed_rank  A small world of its own (one process per GPU, up to 4, only
               where this node has 2 or more GPUs; on CPU, 3 Gloo processes)
               over a SequenceBalancer (and the raw transport where built):
               the last rank exits (os._exit) after a route and before the
               reverse_route; every survivor's reverse_route, its next
               plan_routing and its next raw exchange must raise, not hang,
               within --kill-timeout-s plus slack (15 s + a quarter of it).
               PASS/FAIL; figures: max_error_s, timeout_s. Under torchrun
               rank 0 starts it after every rank has reported, since torchrun
               ends the whole job when one of its workers dies.

Output: a header (devices, torch, its CUDA and NCCL, knapformer's build
info), a table with one row per check (name, verdict, figures, detail), every
FAIL's full detail below it, and a JSON file (--json, ./gpu_check.json) with
every figure, verdict and detail, every rank's own verdict, and the header.
Under torchrun only rank 0 prints and writes; the others send it their
results.

--dry-run checks the arguments, says what would run here and why the rest
would not (with no GPU: "no GPU: torch X (CPU build ...)"), writes the JSON
with every check SKIP and exits 0. --device cpu is the self-test of this
command's own logic, for CI: python_step, exchange_cost, copy_bandwidth,
hub_layout, route_vs_all_to_all (smaller sizes), fsdp2_checkpoint, compiled_block and
killed_rank on --ranks CPU processes over Gloo, the CUDA-only checks SKIP.

Exit status: 0 nothing FAILed; 1 a check FAILed; 2 bad arguments; 3 no GPU
was found (outside --dry-run and --device cpu): nothing was checked. Under
torchrun, ranks other than 0 exit 0 once they have reported (a worker that
exits non-zero makes torchrun stop rank 0 before it reports).

Every wait is bounded. A check that runs longer than --timeout-s (300 s) is
reported as hung: the table and JSON are written with that check FAIL and the
later ones SKIP, every thread's stack goes to stderr, and the run exits 1; the
process groups' and the raw transport's own timeouts are 60 s longer, so the
report comes first. The worlds this command spawns (--device cpu,
killed_rank) are ended when they overstay, and a rank that never reported
FAILs the check naming it.

The environment variable KNAPFORMER_GPU_CHECK_FAULT is for the command's own
tests: corrupt_route adds 1 to one routed value in python_step, which must
then FAIL (a check that cannot fail proves nothing); corrupt_compiled adds 1
to one value of the compiled block's output on rank 0 in compiled_block,
which must then FAIL; hang stops python_step on rank 0, which must be
reported as hung. The report names the fault.
"""

# The parts, one seam each: options (arguments and what runs here), machine (the
# machine's facts, the report's header), world (a rank's Context, the checks in order
# under a watchdog), harness (the worlds it starts with knapformer.launch, the modes,
# main; it re-imports the names of those three that are imported from it), report (a
# result, rows merged from every rank, the text, the JSON, the exit statuses), the
# checks inside a world (cuda_checks: the CUDA path; step_checks: a balanced step, with
# knapformer.side_by_side; fsdp_checks: FSDP2 and torch.compile around the balancer;
# hub_checks: 8 ranks played on one device; each module's WORLD_CHECKS), and
# killed_rank (a world of its own).
from knapformer.gpu_check.cuda_checks import count_host_syncs, on_host
from knapformer.gpu_check.harness import (CHECKS, CUDA_ONLY, FAULTS, Context, main,
                                          parse_options, report_header, run_world_checks,
                                          skip_reasons)
from knapformer.gpu_check.report import (BAD_ARGUMENTS, FAILED, FAULT_ENV, NO_GPU, OK,
                                         exit_status, merge_ranks, render_report, result,
                                         write_json)

__all__ = ["BAD_ARGUMENTS", "CHECKS", "CUDA_ONLY", "FAILED", "FAULTS", "FAULT_ENV", "NO_GPU",
           "OK", "count_host_syncs", "exit_status", "main", "merge_ranks", "render_report",
           "skip_reasons", "write_json",
           # What the tests drive besides: the checks of one rank on a Context, made-up
           # rows and headers, the profiler events the host-sync counter keeps.
           "Context", "on_host", "parse_options", "report_header", "result",
           "run_world_checks"]

// The planner's algorithms (src/memory/planner.cc), private to src/memory: MemAllocator and the
// planner's tests use them; everything outside reaches them through PlanTrace
// (loongforge/memory.h).
#pragma once

#include <string>
#include <vector>

#include "loongforge/memory.h"

namespace loongforge::mem {

// Plans one step. Allocations on different streams never share addresses (so reuse is always
// stream-ordered, within a step and across steps); allocations not freed in the step are not
// placed.
Plan PlanStep(const LifetimeTable& table, const std::string& signature = "");
// The two algorithms on their own (PlanStep runs both and keeps the smaller peak).
Plan PlanGreedyBySize(const LifetimeTable& table);
Plan PlanGreedyByBreadth(const LifetimeTable& table);
// Independent checker: OK iff no two placed allocations that are live at the same time (or are on
// different streams) overlap in address, every offset is aligned and lies inside [0, peak), and
// peak >= lower bound. The error names the offending pair.
Status CheckPlan(const LifetimeTable& table, const Plan& plan);
// Max over time of the sum of live rounded sizes of placed allocations (with `with_carries`, the
// allocations that outlive the step count too, live to its end).
int64_t LowerBoundBytes(const LifetimeTable& table, bool with_carries = false);
// Note [Carry zones]: plans `table` with its carries at fixed offsets in zone `out_zone` (0 or 1)
// of two zones of `zone_bytes` at the arena's bottom, and the other zone kept free until the
// step's last foreign free (where the previous step's carries are). Carries that do not fit the
// zone are not placed. zone_bytes == 0 is PlanStep.
Plan PlanStepWithCarries(const LifetimeTable& table, int64_t zone_bytes, int out_zone,
                         const std::string& signature = "");
// The zone size that holds the carries of any of `tables`: the largest sum of rounded sizes of
// one step's allocations that outlive it (0 when none does).
int64_t CarryZoneBytes(const std::vector<LifetimeTable>& tables);

bool SameStructure(const LifetimeTable& a, const LifetimeTable& b);

// The plan MemAllocator installs for one signature, from its recorded steps in order (at least
// one): the largest step, widened by every step of the same structure. MemAllocator serves an
// allocation from a plan when it is no larger than planned, so the plan serves all merged steps.
// Each other structure among the steps gets a sibling plan, planned together with it (Note
// [Sibling plans]); steps that match no plan diverge into the pool, which serves them inside the
// arena.
// With carry_zone_bytes > 0 (CarryZoneBytes over every recorded step, all signatures alike), the
// plan places carries in zone 0 and its `mirror` in zone 1 (Note [Carry zones]).
SignaturePlan PlanSignature(const std::vector<const LifetimeTable*>& steps,
                            int64_t carry_zone_bytes = 0);
// CheckPlan over every plan of `sp`: the base, its siblings, and the mirror's.
Status CheckSignaturePlan(const SignaturePlan& sp);

}  // namespace loongforge::mem

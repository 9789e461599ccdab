#!/bin/bash
# Written by hpctorch submit: one resource set per node (jsrun -r 1) runs `hpctorch run`,
# which starts $nproc worker(s) per node.
#BSUB -J $job_name
#BSUB -nnodes $nodes
#BSUB -W $time_hm
#BSUB -o $output
$directives
jsrun --nrs $nodes --rs_per_host 1 --tasks_per_rs 1 $jsrun_resources $command

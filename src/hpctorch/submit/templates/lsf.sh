#!/bin/bash
# Written by hpctorch submit: $layout
#BSUB -J $job_name
#BSUB -nnodes $nodes
#BSUB -W $time_hm
#BSUB -o $output
$directives
jsrun --nrs $total_tasks --rs_per_host $tasks_per_node --tasks_per_rs 1 $jsrun_resources $command

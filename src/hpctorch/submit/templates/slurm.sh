#!/bin/bash
# Written by hpctorch submit: $layout
#SBATCH --job-name=$job_name
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$tasks_per_node
#SBATCH --time=$time_slurm
#SBATCH --output=$output
$directives
srun --kill-on-bad-exit=1 $command

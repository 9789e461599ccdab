#!/bin/bash
# Written by hpctorch submit: one task per node runs `hpctorch run`, which starts
# $nproc worker(s) per node and finds the nodes, master and port from Slurm itself.
#SBATCH --job-name=$job_name
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=1
#SBATCH --time=$time_slurm
#SBATCH --output=$output
$directives
srun --kill-on-bad-exit=1 $command
